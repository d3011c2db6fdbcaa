"""``gated_delta_rule_step`` for PyTorch (semantics: core_triton.delta_rule.step);
the op ``twinkernels::gated_delta_rule_step``, forward only, which updates
``state`` in place."""

from __future__ import annotations

import torch

from core_triton.common.launch import run_named
from core_triton.delta_rule import step as core
from torch_api._launch import info, launch
from torch_api._library import check_tensors, fake_info, forward_only_op


def _plans(info_of, query, key, value, beta, state, g, gk, softmax_scale, use_qk_l2norm):
    return core.plans(
        info_of(query, "query"), info_of(key, "key"), info_of(value, "value"), info_of(beta, "beta"),
        info_of(state, "state"), info_of(g, "g"), info_of(gk, "gk"), softmax_scale, use_qk_l2norm,
    )  # fmt: skip


def _run(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    g: torch.Tensor | None,
    gk: torch.Tensor | None,
    softmax_scale: float | None,
    use_qk_l2norm: bool,
) -> torch.Tensor:
    """The launches (eager calls run this directly; it is also the custom
    op's implementation, which mutates ``state``)."""
    steps = _plans(info, query, key, value, beta, state, g, gk, softmax_scale, use_qk_l2norm)
    arrays = {"query": query, "key": key, "value": value, "beta": beta, "state": state, "g": g, "gk": gk}
    inputs = {n: t.contiguous() if n != "state" else t for n, t in arrays.items() if t is not None}
    return run_named(steps, inputs, launch)["o"]


_op = forward_only_op(
    "gated_delta_rule_step",
    _run,
    lambda *args: _plans(lambda t, name: fake_info(t), *args)[-1].outputs[0],  # the output's spec
    mutates_args=("state",),
)


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
    named = dict(query=query, key=key, value=value, beta=beta, state=state, g=g, gk=gk)
    check_tensors(named)
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, beta, state, g, gk)
    ):
        raise ValueError(
            "gated_delta_rule_step updates state in place and has no gradient: call it under "
            "torch.no_grad() (or use gated_delta_rule to train)"
        )
    return _op(query, key, value, beta, state, g, gk, softmax_scale, use_qk_l2norm), state
