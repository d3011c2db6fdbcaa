"""``gated_delta_rule_step`` for PyTorch (semantics: core_triton.delta_rule.step);
the op ``twinkernels::gated_delta_rule_step``, forward only, which updates
``state`` in place."""

from __future__ import annotations

import torch

from core_triton.common.launch import run_named
from core_triton.delta_rule import step as core
from torch_api._launch import info, launch
from torch_api._library import Impl, Param, TorchOp, fake_info

_TENSORS = ("query", "key", "value", "beta", "state", "g", "gk")
PARAMS = (
    *(Param(n, "Tensor?" if n in ("g", "gk") else "Tensor") for n in _TENSORS),
    Param("softmax_scale", "float?"),
    Param("use_qk_l2norm", "bool"),
)


def _plans(info_of, a):
    """The launch plans of the op's arguments ``a`` (by name);
    ``info_of(tensor, name)``."""
    return core.plans(*(info_of(a[n], n) for n in _TENSORS), a["softmax_scale"], a["use_qk_l2norm"])


def _run(a):
    """The launches, which write the new state into ``state``."""
    inputs = {n: a[n] if n == "state" else a[n].contiguous() for n in _TENSORS if a[n] is not None}
    return (run_named(_plans(info, a), inputs, launch)["o"],)


def _fake(a):
    spec = _plans(lambda t, name: fake_info(t), a)[-1].outputs[0]  # the output's spec
    return (torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=a["query"].device),)


_OP = TorchOp("gated_delta_rule_step", PARAMS, 1, Impl.forward_only(_run, _fake), mutates=("state",))


def gated_delta_rule_step(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoding with the gated delta rule: a few new tokens per sequence (row)
    against a carried state; returns ``(output, state)``, forward only.

    query, key ``[B, T, HK, K]``, value ``[B, T, HV, V]``, beta ``[B, T,
    HV]``, g ``[B, T, HV]`` or gk ``[B, T, HV, K]`` as in
    ``gated_delta_rule`` (row ``b`` is one sequence, usually ``T == 1``);
    state ``[B, HV, K, V]`` float32, contiguous.  PyTorch updates ``state``
    in place and returns it; JAX returns the new state (under ``jax.jit``
    with the state's argument donated, in the same buffer).  The result is
    ``gated_delta_rule(..., initial_state=state, output_final_state=True,
    mode="recurrent")``.

    Reference: docs/api.md#gated_delta_rule_step"""
    # A foreign array (no requires_grad) is named by the op's own check.
    if torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in (query, key, value, beta, state, g, gk)
    ):
        raise ValueError(
            "gated_delta_rule_step updates state in place and has no gradient: call it under "
            "torch.no_grad() (or use gated_delta_rule to train)"
        )
    return _OP(query, key, value, beta, state, g, gk, softmax_scale, use_qk_l2norm)[0], state
