"""``chunk_linear_attn`` for PyTorch (semantics: core_triton.linear_attn.chunk);
the op ``twinkernels::chunk_linear_attn``."""

from __future__ import annotations

import torch

from core_triton.linear_attn import chunk as core
from torch_api._library import Param
from torch_api._op import define

_FLOATS = ("query", "key", "value", "g", "g_gamma", "initial_state")


def _make(a, info):
    plans = core.plans(
        *(info(a[n]) for n in ("query", "key", "value", "g", "g_gamma")),
        a["softmax_scale"],
        info(a["initial_state"]),
        a["reverse"],
        info(a["cu_seqlens"]),
        a["chunk_size"],
    )
    return plans, {n: a[n] for n in _FLOATS}


_OP = define(
    "chunk_linear_attn",
    (
        Param("query", "Tensor"),
        Param("key", "Tensor"),
        Param("value", "Tensor"),
        Param("g", "Tensor?"),
        Param("g_gamma", "Tensor?"),
        Param("softmax_scale", "float?"),
        Param("initial_state", "Tensor?"),
        Param("reverse", "bool"),
        Param("cu_seqlens", "Tensor?"),
        Param("chunk_size", "int"),
    ),
    2,
    _make,
    {n: n for n in _FLOATS},
)


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
    """Gated linear attention with scalar gates, computed chunk-parallel:
    ``recurrent`` restricted to ``g`` and ``g_gamma``; returns ``(output,
    final_state)``.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``
    (float32/bfloat16/float16, one dtype; ``HQ % H == 0``; K, V <= 256);
    optional log-space gates g ``[B, T, H]``, g_gamma ``[H]``; initial_state
    ``[N, H, K, V]``; cu_seqlens int32/int64 ``[N+1]`` for packed input (``B
    == 1``).  Defaults: optional inputs None, ``softmax_scale=None`` (``K **
    -0.5``), ``reverse=False``, ``chunk_size=64`` (a power of two, 16..256).
    Returns output ``[B, T, HQ, V]`` (query's dtype) and final_state ``[N, H,
    K, V]`` float32; differentiable in every float input.

    Reference: docs/api.md#chunk_linear_attn"""
    return _OP(query, key, value, g, g_gamma, softmax_scale, initial_state, reverse, cu_seqlens, chunk_size)
