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
    """Inclusive prefix sums over each whole sequence (``reverse``: suffix sums),
    times ``softmax_scale`` if given.

    s: ``[B, T, H]`` or ``[B, T, H, S]`` float (``[B, H, T(, S)]`` with
    ``head_first``); cu_seqlens: int32/int64 ``[N+1]`` for packed input (``B
    == 1``).  Defaults: ``reverse=False, cu_seqlens=None, softmax_scale=None,
    head_first=False, output_dtype=None`` (s's dtype). Returns s's shape in
    ``output_dtype`` (anything ``jnp.dtype`` accepts or None); differentiable
    in ``s``.

    Reference: docs/api.md#chunk_global_cumsum"""
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
