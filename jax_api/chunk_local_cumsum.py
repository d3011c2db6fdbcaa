"""``chunk_local_cumsum`` for JAX (semantics: core_triton.cumsum.chunk_local)."""

from __future__ import annotations

import jax

from core_triton.cumsum import chunk_local as core
from jax_api._launch import dtype_arg, info
from jax_api._op import apply


def chunk_local_cumsum(
    g: jax.Array,
    chunk_size: int,
    reverse: bool = False,
    softmax_scale: float | None = None,
    cu_seqlens: jax.Array | None = None,
    head_first: bool = False,
    output_dtype: object | None = None,
) -> jax.Array:
    """Inclusive running sums inside windows of ``chunk_size`` tokens that start
    at every sequence's first token (``reverse``: sums to the window's end),
    times ``softmax_scale`` if given.

    g: ``[B, T, H]`` or ``[B, T, H, S]`` float (``[B, H, T(, S)]`` with
    ``head_first``); chunk_size: a positive power of two; cu_seqlens:
    int32/int64 ``[N+1]`` for packed input (``B == 1``).  Defaults:
    ``reverse=False, softmax_scale=None, cu_seqlens=None, head_first=False,
    output_dtype=None`` (g's dtype).  Returns g's shape in ``output_dtype``
    (anything ``jnp.dtype`` accepts or None); differentiable in ``g``.

    Reference: docs/api.md#chunk_local_cumsum"""
    info(g, "g")  # a non-array gets its TypeError under the argument's name
    cu = info(cu_seqlens, "cu_seqlens")

    def plan(infos):
        return core.plans(
            infos["x"],
            chunk_size,
            reverse,
            softmax_scale,
            cu,
            head_first,
            dtype_arg(output_dtype),
        )

    return apply(plan, cu_seqlens, {"x": g})
