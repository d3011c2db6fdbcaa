"""``chunk_global_cumsum`` for JAX (semantics: core_triton.cumsum.chunk_global)."""

from __future__ import annotations

import jax

from core_triton.cumsum import chunk_global as core
from jax_api._launch import dtype_arg, info
from jax_api._op import apply


def chunk_global_cumsum(
    s: jax.Array,
    reverse: bool = False,
    cu_seqlens: jax.Array | None = None,
    softmax_scale: float | None = None,
    head_first: bool = False,
    output_dtype: object | None = None,
) -> jax.Array:
    """Inclusive prefix (``reverse``: suffix) sums over each sequence.

    s: ``[B, T, H]`` or ``[B, T, H, S]`` (``[B, H, T(, S)]`` if head_first).
    Returns the same shape in ``output_dtype`` (default: s's dtype).
    """
    info(s, "s")  # a non-array gets its TypeError under the argument's name
    cu = info(cu_seqlens, "cu_seqlens")

    def plan(infos):
        return core.plans(
            infos["x"],
            reverse,
            cu,
            softmax_scale,
            head_first,
            dtype_arg(output_dtype),
        )

    return apply(plan, cu_seqlens, {"x": s})
