"""``recurrent`` for PyTorch (semantics: core_triton.linear_attn.recurrent)."""

from __future__ import annotations

import torch

from core_triton.linear_attn import recurrent as core
from torch_api._launch import host_values, info
from torch_api._op import apply


def recurrent(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention, token by token.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``;
    gates (log decays) g ``[B, T, H]``, g_gamma ``[H]``, gk ``[B, T, H, K]``,
    gv ``[B, T, H, V]``; initial_state ``[N, H, K, V]``.  Returns output
    ``[B, T, HQ, V]`` (query's dtype) and final_state ``[N, H, K, V]`` float32.
    """
    operands = dict(
        query=query, key=key, value=value, g=g, g_gamma=g_gamma, gk=gk, gv=gv, initial_state=initial_state
    )
    plans = core.plans(
        *(info(operands[n], n) for n in ("query", "key", "value", "g", "g_gamma", "gk", "gv")),
        softmax_scale,
        info(initial_state, "initial_state"),
        reverse,
        info(cu_seqlens, "cu_seqlens"),
        host_values(cu_seqlens),
    )
    return apply(plans, cu_seqlens, operands)
