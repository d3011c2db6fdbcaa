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
    """Gated linear attention with scalar gates, computed chunk-parallel.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``,
    g ``[B, T, H]`` and g_gamma ``[H]`` (log decays), initial_state
    ``[N, H, K, V]``.  Returns ``(output [B, T, HQ, V], final_state [N, H,
    K, V] float32)``; differentiable in every float input.  ``cu_seqlens``
    may be traced under ``jax.jit``.
    """
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
