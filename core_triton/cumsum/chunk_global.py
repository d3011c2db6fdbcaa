"""``chunk_global_cumsum``: running sums over each whole sequence.

Input ``s``: ``[B, T, H]`` or ``[B, T, H, S]`` (``[B, H, T(, S)]`` with
``head_first``).  Forward: inclusive prefix sum along time inside every
sequence (``reverse``: inclusive suffix sum, from each sequence's own last
token), times ``softmax_scale``.  Backward: the opposite-direction sum of the
cotangent, times the same scale, in the input's dtype.

One program scans one sequence (or batch row) for a tile of features, in
blocks of 64 tokens, so the grid is ``[N or 1, 1 or B, feature tiles]``.
"""

from __future__ import annotations

from core_triton.common.launch import TensorInfo
from core_triton.common.op import OpPlans
from core_triton.cumsum import plan as _cumsum_plan


def plans(
    s: TensorInfo,
    reverse=False,
    cu_seqlens: TensorInfo | None = None,
    softmax_scale=None,
    head_first=False,
    output_dtype=None,
) -> OpPlans:
    """Check the arguments and plan forward and backward launches (inputs
    ``x``, ``cu_seqlens``; output ``[*s.shape]``)."""
    reverse, scale, head_first, out_dtype = _cumsum_plan.validate(
        s,
        cu_seqlens,
        reverse,
        softmax_scale,
        head_first,
        output_dtype,
        "s",
    )
    return _cumsum_plan.make_plans(
        s,
        cu_seqlens,
        chunk=None,
        reverse=reverse,
        scale=scale,
        head_first=head_first,
        out_dtype=out_dtype,
        zero_uncovered=True,
    )
