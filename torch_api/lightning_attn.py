"""``lightning_attn`` for PyTorch (semantics: core_triton.linear_attn.lightning)."""

from __future__ import annotations

import torch

from core_triton.linear_attn import lightning as core
from torch_api._launch import device_constant, info
from torch_api.chunk_linear_attn import chunk_linear_attn
from torch_api.recurrent import recurrent


def lightning_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layer_idx: int,
    num_layers: int,
    softmax_scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    mode: str = "chunk",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Linear attention with the depth-dependent per-head decay.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``,
    initial_state ``[N, H, K, V]``.  Returns output ``[B, T, HQ, V]`` and
    final_state ``[N, H, K, V]`` float32.
    """
    g_gamma, mode = core.decay(info(key, "key"), layer_idx, num_layers, mode)
    op = chunk_linear_attn if mode == "chunk" else recurrent
    return op(
        query,
        key,
        value,
        g_gamma=device_constant(tuple(g_gamma.tolist()), torch.float32, key.device),
        softmax_scale=softmax_scale,
        initial_state=initial_state,
        reverse=reverse,
        cu_seqlens=cu_seqlens,
    )
