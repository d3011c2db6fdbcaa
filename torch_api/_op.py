"""One implementation for every op that core_triton describes as
:class:`core_triton.common.op.OpPlans`, and the helper that makes it a
``twinkernels::`` op (:mod:`torch_api._library`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from core_triton import run_named
from core_triton.common.op import OpPlans
from core_triton.common.sequences import chunk_offsets_plan
from torch_api._launch import info, launch
from torch_api._library import Impl, Param, TorchOp, fake_info

# make(args, info) -> (plans, operands): the op's plans for ``args`` (every
# parameter by name; ``info`` turns a tensor into a TensorInfo) and its
# operands by the plans' input names.
Make = Callable[[dict, Callable], tuple[OpPlans, dict]]


def _spec(steps, name: str):
    for step in reversed(steps):
        for out, spec in zip(step.output_names, step.outputs, strict=True):
            if out == name:
                return spec
    raise KeyError(name)


def _index(plans: OpPlans, cu_seqlens: torch.Tensor | None) -> dict:
    """``cu_seqlens`` and the clamped chunk offsets the plans read."""
    if cu_seqlens is None:
        return {}
    index = {"cu_seqlens": cu_seqlens}
    for name, size in plans.offsets:
        step = chunk_offsets_plan(cu_seqlens.shape[0] - 1, plans.seq_len, size, name)
        index[name] = launch(step, {"cu_seqlens": cu_seqlens})[0]
    return index


def _extra_names(plans: OpPlans) -> tuple[str, ...]:
    """The forward arrays the backward reads that are not outputs (a custom
    op may not return one tensor twice), then the chunk offsets."""
    residuals = (n for n in plans.residuals if n not in plans.outputs)
    return (*residuals, *(n for n, _ in plans.offsets))


def _given(plans: OpPlans, operands: dict) -> dict:
    named = {n: operands[n] for n in plans.inputs if operands.get(n) is not None}
    if plans.contiguous:
        named = {n: t.contiguous() for n, t in named.items()}
    return named


def plans_impl(make: Make, tensor_params: tuple[str, ...], grad_of: dict[str, str]) -> Impl:
    """The :class:`Impl` of an OpPlans op whose tensor parameters are
    ``tensor_params``; ``grad_of`` maps each that can have a gradient to its
    plans' input name."""

    def run(args, steps):
        """Plan a call and run the launches ``steps(plans)``: ``(plans,
        named inputs, index inputs, every named array)``."""
        plans, operands = make(args, info)
        index = _index(plans, args.get("cu_seqlens"))
        named = _given(plans, operands)
        return plans, named, index, run_named(steps(plans), {**named, **index}, launch)

    def forward(args):
        plans, named, index, env = run(args, lambda p: p.forward)
        outputs = tuple(env[n] for n in plans.outputs)
        extras = [{**env, **index}[n] for n in _extra_names(plans)]
        return outputs, extras, (plans, named)

    def inference(args):
        plans, _, _, env = run(args, lambda p: p.forward_only)
        return tuple(env[n] for n in plans.outputs)

    def backward(args, outputs, extras, cotangents, needs, state):
        if state is None:
            plans, operands = make(args, info)
            named = _given(plans, operands)
        else:
            plans, named = state
        env = dict(zip(plans.outputs, outputs, strict=True))
        env.update(zip(_extra_names(plans), extras, strict=True))
        if args.get("cu_seqlens") is not None:
            env["cu_seqlens"] = args["cu_seqlens"]
        # An unused output's cotangent arrives as None: zeros then.
        cts = [
            torch.zeros_like(o) if c is None else c.to(o.dtype)
            for c, o in zip(cotangents, outputs, strict=True)
        ]
        if plans.contiguous:
            cts = [c.contiguous() for c in cts]
        steps = plans.backward_plans(tuple(info(c) for c in cts))
        env = run_named(steps, {**named, **env, **dict(zip(plans.cotangents, cts, strict=True))}, launch)
        grads = {n: env[out].to(named[n].dtype) for n, out in plans.grads}
        return tuple(grads.get(grad_of[p]) if p in grad_of else None for p in tensor_params)

    def fake_forward(args):
        plans, _ = make(args, fake_info)
        device = next(v.device for v in args.values() if isinstance(v, torch.Tensor))

        def empty(spec):
            return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=device)

        outputs = tuple(empty(_spec(plans.forward, n)) for n in plans.outputs)
        extras = [empty(_spec(plans.forward, n)) for n in plans.residuals if n not in plans.outputs]
        cu = args.get("cu_seqlens")
        for name, size in plans.offsets:
            extras.append(empty(chunk_offsets_plan(cu.shape[0] - 1, plans.seq_len, size, name).outputs[0]))
        return outputs, extras

    def fake_backward(args, outputs, extras, cotangents, needs):
        plans, operands = make(args, fake_info)
        has_grad = {n for n, _ in plans.grads if operands.get(n) is not None}

        def grad(p):
            t = args[p]
            if p not in grad_of or grad_of[p] not in has_grad:
                return None
            return torch.empty(t.shape, dtype=t.dtype, device=t.device)

        return tuple(grad(p) for p in tensor_params)

    return Impl(forward, backward, fake_forward, fake_backward, inference)


def define(
    name: str, params: tuple[Param, ...], n_outputs: int, make: Make, grad_of: dict[str, str]
) -> TorchOp:
    """The ``twinkernels::<name>`` op of an OpPlans op."""
    impl = plans_impl(make, tuple(p.name for p in params if p.is_tensor), grad_of)
    return TorchOp(name, params, n_outputs, impl)
