"""``chunk_linear_attn`` for JAX (semantics: core_triton.chunk_linear_attn)."""

from __future__ import annotations

import jax
import numpy as np

from core_triton import chunk_linear_attn as core
from core_triton import run_named
from jax_api._launch import host_values, info, launch
from jax_api.utils import prepare_chunk_offsets

_FLOAT_INPUTS = ("query", "key", "value", "g", "g_gamma", "initial_state")


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
    given = dict(query=query, key=key, value=value, g=g, g_gamma=g_gamma, initial_state=initial_state)
    plans = core.plans(
        info(query),
        info(key),
        info(value),
        info(g),
        info(g_gamma),
        softmax_scale,
        info(initial_state),
        reverse,
        info(cu_seqlens),
        chunk_size,
        host_values(cu_seqlens),
    )
    floats = {n: given[n] for n in _FLOAT_INPUTS if given[n] is not None}
    index = {}
    if cu_seqlens is not None:
        index["cu_seqlens"] = cu_seqlens
        for name, size in plans.offsets:
            index[name] = prepare_chunk_offsets(cu_seqlens, size)

    def forward(floats, index):
        return run_named(plans.forward, {**floats, **index}, launch)

    @jax.custom_vjp
    def op(floats, index):
        env = forward(floats, index)
        return env["o"], env["final"]

    def fwd(floats, index):
        env = forward(floats, index)
        residuals = {n: env[n] for n in plans.residuals}
        return (env["o"], env["final"]), (floats, index, residuals)

    def bwd(saved, cotangents):
        floats, index, residuals = saved
        do, dht = cotangents
        env = run_named(
            plans.backward,
            {**floats, **index, **residuals, "do": do.astype(floats["query"].dtype), "dht": dht},
            launch,
        )
        grads = {n: env[out].astype(floats[n].dtype) for n, out in plans.grads}
        zeros = jax.tree.map(lambda a: np.zeros(a.shape, jax.dtypes.float0), index)
        return grads, zeros

    op.defvjp(fwd, bwd)
    return op(floats, index)
