"""``lightning_attn`` for JAX (semantics: core_triton.linear_attn.lightning)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from core_triton.linear_attn import lightning as core
from jax_api._launch import info
from jax_api._op import apply
from jax_api.recurrent import recurrent


def lightning_attn(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    layer_idx: int,
    num_layers: int,
    softmax_scale: float | None = None,
    initial_state: jax.Array | None = None,
    reverse: bool = False,
    cu_seqlens: jax.Array | None = None,
    mode: str = "chunk",
) -> tuple[jax.Array, jax.Array]:
    """Linear attention with the per-head constant decay ``g_gamma[h] = -(8 / H)
    * (1 - layer_idx / num_layers) * h``; returns ``(output, final_state)``.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``; ``0
    <= layer_idx < num_layers``; initial_state ``[N, H, K, V]``; cu_seqlens
    int32/int64 ``[N+1]`` for packed input.  Defaults: ``softmax_scale=None``
    (``K ** -0.5``), ``initial_state=None``, ``reverse=False``,
    ``cu_seqlens=None``, ``mode="chunk"`` (or ``"recurrent"``).  Returns
    output ``[B, T, HQ, V]`` and final_state ``[N, H, K, V]`` float32;
    differentiable in query, key, value and initial_state (the decay is a
    constant).

    Reference: docs/api.md#lightning_attn"""
    g_gamma, mode = core.decay(info(key, "key"), layer_idx, num_layers, mode)
    g_gamma = jax.lax.stop_gradient(jnp.asarray(g_gamma))
    if mode == "recurrent":
        return recurrent(
            query, key, value, g_gamma=g_gamma, softmax_scale=softmax_scale, initial_state=initial_state,
            reverse=reverse, cu_seqlens=cu_seqlens,
        )  # fmt: skip
    operands = dict(query=query, key=key, value=value, g_gamma=g_gamma, initial_state=initial_state)
    cu = info(cu_seqlens, "cu_seqlens")

    def plan(infos):
        # core's chunk plans for the decay as a constant (no gradient).
        return core.plans(
            *(infos[n] for n in ("query", "key", "value")), layer_idx, num_layers, softmax_scale,
            infos.get("initial_state"), reverse, cu, mode,
        )[0]  # fmt: skip

    return apply(plan, cu_seqlens, operands, shared=("g_gamma",))
