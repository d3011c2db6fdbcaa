"""``recurrent`` for JAX (semantics: core_triton.linear_attn.recurrent)."""

from __future__ import annotations

import jax

from core_triton.linear_attn import recurrent as core
from jax_api._launch import info
from jax_api._op import apply


def recurrent(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    g: jax.Array | None = None,
    g_gamma: jax.Array | None = None,
    gk: jax.Array | None = None,
    gv: jax.Array | None = None,
    softmax_scale: float | None = None,
    initial_state: jax.Array | None = None,
    reverse: bool = False,
    cu_seqlens: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Gated linear attention, token by token: returns ``(output, final_state)``.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``
    (float32/bfloat16/float16, one dtype; ``HQ % H == 0``; K, V <= 256);
    optional log-space gates g ``[B, T, H]``, g_gamma ``[H]``, gk ``[B, T, H,
    K]``, gv ``[B, T, H, V]``; initial_state ``[N, H, K, V]`` (``N = B`` or
    the number of packed sequences); cu_seqlens int32/int64 ``[N+1]`` for
    packed input (``B == 1``).  Defaults: every optional input None,
    ``softmax_scale=None`` (``K ** -0.5``), ``reverse=False``.  Returns output
    ``[B, T, HQ, V]`` (query's dtype) and final_state ``[N, H, K, V]``
    float32; differentiable in every float input.

    Reference: docs/api.md#recurrent"""
    operands = dict(
        query=query, key=key, value=value, g=g, g_gamma=g_gamma, gk=gk, gv=gv, initial_state=initial_state
    )
    cu = info(cu_seqlens, "cu_seqlens")

    def plan(infos):
        return core.plans(
            *(infos.get(n) for n in ("query", "key", "value", "g", "g_gamma", "gk", "gv")),
            softmax_scale,
            infos.get("initial_state"),
            reverse,
            cu,
        )

    return apply(plan, cu_seqlens, operands, shared=("g_gamma",))
