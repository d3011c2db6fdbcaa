"""``chunk_linear_attn`` for PyTorch (semantics: core_triton.linear_attn.chunk)."""

from __future__ import annotations

import torch

from core_triton.linear_attn import chunk as core
from torch_api._launch import host_values, info
from torch_api._op import apply


def chunk_linear_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention with scalar gates, computed chunk-parallel.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``,
    g ``[B, T, H]`` and g_gamma ``[H]`` (log decays), initial_state
    ``[N, H, K, V]``.  Returns ``(output [B, T, HQ, V], final_state [N, H,
    K, V] float32)``; differentiable in every float input.  Non-contiguous
    inputs are copied to contiguous ones.
    """
    operands = dict(query=query, key=key, value=value, g=g, g_gamma=g_gamma, initial_state=initial_state)
    plans = core.plans(
        info(query, "query"),
        info(key, "key"),
        info(value, "value"),
        info(g, "g"),
        info(g_gamma, "g_gamma"),
        softmax_scale,
        info(initial_state, "initial_state"),
        reverse,
        info(cu_seqlens, "cu_seqlens"),
        chunk_size,
        host_values(cu_seqlens),
    )
    return apply(plans, cu_seqlens, operands)
