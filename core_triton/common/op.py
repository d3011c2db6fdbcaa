"""What makes launch plans a differentiable op, said once for every op.

An op module returns :class:`OpPlans`; each binding has one runner
(``torch_api/_op.py``: a ``torch.autograd.Function``; ``jax_api/_op.py``: a
``jax.custom_vjp``) that walks it, so an op's binding file is its
signature, its docstring and the call that plans it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core_triton.common.launch import LaunchPlan, TensorInfo


@dataclass(frozen=True)
class OpPlans:
    """The launches of one call, and how they connect.

    Forward: ``forward`` runs on the arrays named in ``inputs`` (those
    given) and the index inputs: ``cu_seqlens`` (packed input) and, for
    each ``(name, size)`` of ``offsets``, the cumulative chunk counts of
    chunks of ``size`` under ``name``: ``prepare_chunk_offsets(cu_seqlens,
    size)``, but of the sequences as the kernels clamp them into the
    ``seq_len`` tokens, so that an entry that breaks the contract takes no
    chunk slot from the sequences after it (one launch of
    ``core_triton.common.sequences.chunk_offsets_plan``, in both
    bindings).  The op returns the arrays named in ``outputs`` (one array
    when there is one name).

    Backward: ``backward`` (a tuple of launches, or a function of the
    cotangents' TensorInfos that returns one) runs on the inputs named in
    ``saved``, the index inputs, the forward arrays named in ``residuals``
    and each output's cotangent, cast to that output's dtype, under the
    matching name of ``cotangents``.  ``grads`` pairs each input with the
    backward array that holds its gradient, which the op returns in the
    input's dtype; the index inputs get none.

    ``inference``: the launches of a call that no gradient follows, where
    they differ from ``forward`` (a faster forward that keeps nothing for
    the backward: the same inputs, index inputs and ``outputs``); empty
    where ``forward`` serves.  The runners take it for a call that is not
    differentiated (PyTorch: grad mode off or no input requiring grad;
    JAX: the ``custom_vjp``'s primal, which JAX runs when it does not
    differentiate).

    ``contiguous``: inputs and cotangents are made row-major before they
    reach the kernels (else the plans read their strides).  ``args``: the
    op's checked sizes and options, for readers."""

    forward: tuple[LaunchPlan, ...]
    backward: tuple[LaunchPlan, ...] | Callable[..., tuple[LaunchPlan, ...]]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cotangents: tuple[str, ...]
    grads: tuple[tuple[str, str], ...]
    saved: tuple[str, ...] = ()
    residuals: tuple[str, ...] = ()
    offsets: tuple[tuple[str, int], ...] = ()
    seq_len: int = 0
    contiguous: bool = True
    args: Any = None
    inference: tuple[LaunchPlan, ...] = ()

    @property
    def forward_only(self) -> tuple[LaunchPlan, ...]:
        """The launches of a call that no gradient follows."""
        return self.inference or self.forward

    def backward_plans(self, cotangents: tuple[TensorInfo, ...]) -> tuple[LaunchPlan, ...]:
        """The backward launches for cotangents described by ``cotangents``."""
        return self.backward(*cotangents) if callable(self.backward) else self.backward

    def output_dtype(self, name: str) -> str:
        """The dtype name of the forward array ``name``."""
        for step in reversed(self.forward):
            for out, spec in zip(step.output_names, step.outputs, strict=True):
                if out == name:
                    return spec.dtype
        raise KeyError(f"no forward launch writes {name!r}")
