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
    """Inclusive sums inside windows of ``chunk_size`` tokens, restarting at
    every sequence's first token.

    g: ``[B, T, H]`` or ``[B, T, H, S]`` (``[B, H, T(, S)]`` if head_first).
    Returns the same shape in ``output_dtype`` (default: g's dtype).
    """
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
