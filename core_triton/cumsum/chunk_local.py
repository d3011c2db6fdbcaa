"""``chunk_local_cumsum``: running sums inside windows of ``chunk_size`` tokens.

Input ``g``: ``[B, T, H]`` or ``[B, T, H, S]`` (``[B, H, T(, S)]`` with
``head_first``).  Windows start at every sequence's first token and cover
``chunk_size`` tokens (the last window of a sequence may be shorter).
Forward: inclusive sum from the window's start (``reverse``: to its end),
times ``softmax_scale``.  Backward: the same over the same windows in the
opposite direction, times the same scale, in the input's dtype.

With packed input the binding also supplies ``chunk_offsets =
prepare_chunk_offsets(cu_seqlens, chunk_size)`` (``[N+1]``); the grid has
``cdiv(T, chunk_size) + N`` slots, an upper bound on the chunk count that is
known from shapes alone, so traced ``cu_seqlens`` work under ``jax.jit``.
"""

from __future__ import annotations

from core_triton.common import checks
from core_triton.common.launch import TensorInfo
from core_triton.common.op import OpPlans
from core_triton.cumsum import plan as _cumsum_plan


def plans(
    g: TensorInfo,
    chunk_size,
    reverse=False,
    softmax_scale=None,
    cu_seqlens: TensorInfo | None = None,
    head_first=False,
    output_dtype=None,
) -> OpPlans:
    """Check the arguments and plan forward and backward launches (inputs
    ``x``, ``cu_seqlens``, ``chunk_offsets``; output ``[*g.shape]``)."""
    chunk = checks.check_power_of_two(chunk_size, "chunk_size")
    reverse, scale, head_first, out_dtype = _cumsum_plan.validate(
        g,
        cu_seqlens,
        reverse,
        softmax_scale,
        head_first,
        output_dtype,
        "g",
    )
    return _cumsum_plan.make_plans(
        g,
        cu_seqlens,
        chunk=chunk,
        reverse=reverse,
        scale=scale,
        head_first=head_first,
        out_dtype=out_dtype,
        zero_uncovered=True,
    )
