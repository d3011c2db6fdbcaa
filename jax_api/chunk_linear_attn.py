"""``chunk_linear_attn`` for JAX (semantics: core_triton.linear_attn.chunk)."""

from __future__ import annotations

import jax

from core_triton.linear_attn import chunk as core
from jax_api._launch import info
from jax_api._op import apply


def chunk_linear_attn(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    g: jax.Array | None = None,
    g_gamma: jax.Array | None = None,
    softmax_scale: float | None = None,
    initial_state: jax.Array | None = None,
    reverse: bool = False,
    cu_seqlens: jax.Array | None = None,
    chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
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
    operands = dict(query=query, key=key, value=value, g=g, g_gamma=g_gamma, initial_state=initial_state)
    cu = info(cu_seqlens, "cu_seqlens")

    def plan(infos):
        return core.plans(
            *(infos.get(n) for n in ("query", "key", "value", "g", "g_gamma")),
            softmax_scale,
            infos.get("initial_state"),
            reverse,
            cu,
            chunk_size,
        )

    return apply(plan, cu_seqlens, operands, shared=("g_gamma",))
