"""The public ops as ``torch.library`` custom ops (namespace ``twinkernels``).

Each op is a pair of custom ops:

* ``twinkernels::<op>``: the op's outputs, then a ``Tensor[]`` of the
  arrays its backward needs besides inputs and outputs (residuals, chunk
  offsets);
* ``twinkernels::<op>_backward``: one optional gradient per tensor argument;

with fake implementations planned by the same core_triton code (exact
shapes and dtypes) and ``register_autograd`` joining the two.  Ops without
a gradient (``decode_attention``, ``gated_delta_rule_step``, which updates
its state in place: an :class:`Impl` without a backward) are the first
custom op alone, returning the outputs only.  To
``torch.compile`` (Dynamo, AOTAutograd, Inductor) and ``torch.export`` each
is one opaque node: no graph break, and the backward is a node too.  Why
``custom_op`` rather than ``triton_op``: a call is several launches whose
grids, block sizes and outputs come from host-side plans, with a replay
fast path for the launches; Inductor cannot fuse into our kernels, and
under the interpreter (CPU) ``wrap_triton`` has no Inductor lowering.

Eager calls take a shorter road to the same implementation: a
``torch.autograd.Function`` (the dispatcher and ``register_autograd``
wrapping cost about 40 us per forward+backward on the host, which at small
sizes is most of the call), or, for a call autograd does not record, the
op's forward for such calls (``Impl.inference``) where it has one.  Under
``torch.compile`` and ``torch.export`` (``torch.compiler.is_compiling()``),
and for meta tensors, the custom op is used.  Both roads run
:attr:`TorchOp.forward` and :attr:`TorchOp.backward`; the tests compare them.

Inside an op nothing waits for the device: no ``.item()``, ``.tolist()``
or host copy of a tensor's values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import forward_ad

NAMESPACE = "twinkernels"


@dataclass(frozen=True)
class Param:
    """One argument: its name and schema type (``Tensor``, ``Tensor?``,
    ``bool``, ``int``, ``float?``, ``str``, ``int[]?``, ``ScalarType?``)."""

    name: str
    type: str

    @property
    def is_tensor(self) -> bool:
        return self.type.startswith("Tensor")


@dataclass(frozen=True)
class Impl:
    """What an op computes, on real or fake tensors.

    ``forward(args) -> (outputs, extras, state)``: ``args`` maps every
    parameter name to its value; ``state`` is anything the backward may
    reuse in the same process (``None`` is fine).
    ``backward(args, outputs, extras, cotangents, needs, state) -> grads``:
    ``cotangents`` has one entry per output (``None`` where unused),
    ``needs`` one bool per tensor parameter, ``grads`` one entry (a tensor
    in the input's dtype and shape, or ``None``) per tensor parameter;
    ``state`` is ``None`` when the backward runs as its own op.
    ``fake_forward(args) -> (outputs, extras)`` and ``fake_backward(args,
    outputs, extras, cotangents, needs) -> grads``: the same shapes and
    dtypes, no launch.  ``inference(args) -> outputs`` (optional): the
    outputs of an eager call that no gradient follows (grad mode off, or
    no tensor argument requiring grad), which need keep nothing for a
    backward.  An op without a gradient has ``backward`` and
    ``fake_backward`` None (its ``extras`` are then never read)."""

    forward: Callable[..., tuple[tuple[torch.Tensor, ...], list[torch.Tensor], Any]]
    backward: Callable[..., tuple[torch.Tensor | None, ...]] | None
    fake_forward: Callable[..., tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]]
    fake_backward: Callable[..., tuple[torch.Tensor | None, ...]] | None
    inference: Callable[..., tuple[torch.Tensor, ...]] | None = None

    @classmethod
    def forward_only(cls, run: Callable, fake: Callable) -> Impl:
        """The Impl of an op without a gradient: ``run(args)`` and
        ``fake(args)`` return its outputs (a tuple)."""
        return cls(lambda a: (run(a), [], None), None, lambda a: (fake(a), []), None)


class TorchOp:
    """A public op: ``twinkernels::<name>`` and its backward, and the
    eager road to the same :class:`Impl`.  ``mutates``: tensor parameters
    the op writes in place (an op without a gradient only)."""

    def __init__(
        self, name: str, params: tuple[Param, ...], n_outputs: int, impl: Impl, mutates: tuple[str, ...] = ()
    ):
        self.name = name
        self.params = params
        self.names = tuple(p.name for p in params)
        self.tensor_index = tuple(i for i, p in enumerate(params) if p.is_tensor)
        self.tensor_names = tuple(self.names[i] for i in self.tensor_index)
        self.option_index = tuple(i for i, p in enumerate(params) if not p.is_tensor)
        self.n_outputs = n_outputs
        self.impl = impl
        self.differentiable = impl.backward is not None
        if mutates and self.differentiable:
            raise ValueError(f"{name}: an op that writes its inputs in place has no gradient")
        # A written tensor is an alias annotation in the schema: Tensor(a!).
        marks = {n: f"(a{i}!)" for i, n in enumerate(mutates)}
        signature = ", ".join(f"{p.type}{marks.get(p.name, '')} {p.name}" for p in params)
        outs = ", ".join(["Tensor"] * n_outputs + ["Tensor[]"] * self.differentiable)
        self.op = torch.library.custom_op(
            f"{NAMESPACE}::{name}", mutates_args=mutates, schema=f"({signature}) -> ({outs})"
        )(self._forward_op)
        self.op.register_fake(self._fake_forward_op)
        if not self.differentiable:
            return
        # One optional gradient per tensor argument (a schema's 1-tuple is
        # written without parentheses).
        n_t = len(self.tensor_index)
        grads = "Tensor?" if n_t == 1 else "(" + ", ".join(["Tensor?"] * n_t) + ")"
        self.backward_op = torch.library.custom_op(
            f"{NAMESPACE}::{name}_backward",
            mutates_args=(),
            schema=f"({signature}, Tensor[] outputs, Tensor[] extras, Tensor?[] cotangents, bool[] needs)"
            f" -> {grads}",
        )(self._backward_op)
        self.backward_op.register_fake(self._fake_backward_op)
        self.op.register_autograd(self._autograd_backward, setup_context=self._setup_context)

    # ---- the custom ops ------------------------------------------------------

    def _forward_op(self, *args):
        outputs, extras, _ = self.impl.forward(dict(zip(self.names, args, strict=True)))
        return self._op_outputs(outputs, extras)

    def _fake_forward_op(self, *args):
        outputs, extras = self.impl.fake_forward(dict(zip(self.names, args, strict=True)))
        return self._op_outputs(outputs, extras)

    def _op_outputs(self, outputs, extras):
        """The custom op's return: the outputs, then the extras' list where
        there is a backward to read it (a schema's 1-tuple is one tensor)."""
        if self.differentiable:
            return (*outputs, extras)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _split_backward_args(self, args):
        n = len(self.params)
        return dict(zip(self.names, args[:n], strict=True)), *args[n:]

    def _backward_op(self, *args):
        named, outputs, extras, cts, needs = self._split_backward_args(args)
        return self._one_or_tuple(self.impl.backward(named, outputs, extras, cts, needs, None))

    def _fake_backward_op(self, *args):
        named, outputs, extras, cts, needs = self._split_backward_args(args)
        return self._one_or_tuple(self.impl.fake_backward(named, outputs, extras, cts, needs))

    def _one_or_tuple(self, grads):
        grads = tuple(grads)
        return grads[0] if len(grads) == 1 else grads

    def _setup_context(self, ctx, inputs, output):
        outputs, extras = output[: self.n_outputs], output[self.n_outputs]
        ctx.options = {p.name: v for p, v in zip(self.params, inputs, strict=True) if not p.is_tensor}
        ctx.save_for_backward(*(inputs[i] for i in self.tensor_index), *outputs, *extras)
        ctx.n_extras = len(extras)
        ctx.set_materialize_grads(False)

    def _autograd_backward(self, ctx, *grads):
        saved = ctx.saved_tensors
        n_t = len(self.tensor_index)
        tensors = saved[:n_t]
        outputs = list(saved[n_t : n_t + self.n_outputs])
        extras = list(saved[n_t + self.n_outputs :])
        args = dict(ctx.options)
        args.update(zip(self.tensor_names, tensors, strict=True))
        needs = [bool(ctx.needs_input_grad[i]) for i in self.tensor_index]
        cts = list(grads[: self.n_outputs])
        tensor_grads = self.backward_op(*(args[n] for n in self.names), outputs, extras, cts, needs)
        if len(self.tensor_index) == 1:
            tensor_grads = (tensor_grads,)
        return self._per_param(tensor_grads)

    def _per_param(self, tensor_grads):
        out: list[Any] = [None] * len(self.params)
        for i, g in zip(self.tensor_index, tensor_grads, strict=True):
            out[i] = g
        return tuple(out)

    # ---- the public entry ----------------------------------------------------

    def __call__(self, *args) -> tuple[torch.Tensor, ...]:
        """The op's outputs for ``args`` (every parameter, in order).

        One pass over the tensor arguments finds what the road depends on
        (each check a pass of its own was a tenth of an eager call's host
        time): a ``TypeError`` naming the first that is neither None nor a
        ``torch.Tensor`` (a JAX or numpy array handed to this binding);
        whether one is a meta tensor and whether one requires grad."""
        tensors = [args[i] for i in self.tensor_index]
        # The custom op under torch.compile / torch.export, and for meta
        # tensors (no data: the fake implementation gives outputs of the
        # right shapes and dtypes on the meta device, as torch's own ops do).
        meta = compiling = torch.compiler.is_compiling()
        grad = False
        for name, t in zip(self.tensor_names, tensors, strict=True):
            if t is None:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if not compiling:  # (a traced graph would keep the unused reads)
                meta = meta or t.is_meta
                grad = grad or t.requires_grad
        if meta:
            outputs = self.op(*args)
            if not self.differentiable and self.n_outputs == 1:
                return (outputs,)
            return tuple(outputs[: self.n_outputs])
        if not self.differentiable:
            return tuple(self.impl.forward(dict(zip(self.names, args, strict=True)))[0])
        # A call autograd does not record keeps nothing for a backward.  Not
        # under forward-mode AD (its dual tensors do not require grad):
        # autograd.Function says there that it has no jvp rather than
        # dropping the tangents.
        recorded = (grad and torch.is_grad_enabled()) or forward_ad._current_level >= 0
        if self.impl.inference is not None and not recorded:
            return tuple(self.impl.inference(dict(zip(self.names, args, strict=True))))
        options = {self.names[i]: args[i] for i in self.option_index}
        return _Eager.apply(self, options, *tensors)


class _Eager(torch.autograd.Function):
    """The eager road: :class:`Impl` under one ``autograd.Function``."""

    @staticmethod
    def forward(ctx, op: TorchOp, options: dict, *tensors):
        args = dict(options)
        args.update(zip(op.tensor_names, tensors, strict=True))
        outputs, extras, state = op.impl.forward(args)
        ctx.op, ctx.options, ctx.state = op, options, state
        ctx.n_extras = len(extras)
        ctx.save_for_backward(*tensors, *outputs, *extras)
        ctx.set_materialize_grads(False)
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *cts):
        op = ctx.op
        saved = ctx.saved_tensors
        n_t = len(op.tensor_index)
        args = dict(ctx.options)
        args.update(zip(op.tensor_names, saved[:n_t], strict=True))
        outputs = list(saved[n_t : n_t + op.n_outputs])
        extras = list(saved[n_t + op.n_outputs :])
        needs = [bool(n) for n in ctx.needs_input_grad[2:]]
        grads = op.impl.backward(args, outputs, extras, list(cts), needs, ctx.state)
        return None, None, *grads


def fake_info(t: torch.Tensor | None):
    """A fake tensor's TensorInfo with plain ints: a symbolic size is
    specialised (the plans choose grids and tiles from sizes, so the op
    compiles per shape, as under ``dynamic=False``)."""
    from core_triton import TensorInfo

    if t is None:
        return None
    return TensorInfo(
        tuple(int(s) for s in t.shape),
        str(t.dtype).split(".")[-1],
        tuple(int(s) for s in t.stride()),
        str(t.device),
    )
