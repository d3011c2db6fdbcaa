"""L2 normalisation of query and key over their head dim, as the delta-rule
layers apply it inside the op (``use_qk_l2norm``)::

    y = x / sqrt(sum(x**2) + eps)          eps = 1e-6 (naive.L2NORM_EPS)
    dx = (dy - y * sum(y * dy)) / sqrt(sum(x**2) + eps)

Rows are the ``R = B * T * heads`` vectors of ``K`` features (contiguous);
sums in float32.  The forward writes ``y`` in the input's dtype (the
kernels that read it take one dtype for query, key and value); the
backward reads ``x`` again rather than a saved norm.
"""

from __future__ import annotations

import triton.language as tl

from core_triton.common.launch import In, LaunchPlan, OutputSpec
from core_triton.common.runtime import jit
from core_triton.common.utils import cdiv, next_power_of_2, prod
from core_triton.delta_rule.naive import L2NORM_EPS

# Elements per program: enough per load to keep an SM busy.
_TILE = 4096


@jit(sizes=("R",))
def l2norm_fwd_kernel(x, R, y, K: tl.constexpr, EPS: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m = (rows < R)[:, None] & (o_k < K)[None, :]
    p = rows[:, None] * K + o_k[None, :]
    b_x = tl.load(x + p, mask=m, other=0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) + EPS)
    tl.store(y + p, (b_x * rstd[:, None]).to(y.dtype.element_ty), mask=m)


@jit(sizes=("R",))
def l2norm_bwd_kernel(
    x, dy, R, dx, K: tl.constexpr, EPS: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr,
    PARTS: tl.constexpr = 1,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m = (rows < R)[:, None] & (o_k < K)[None, :]
    p = rows[:, None] * K + o_k[None, :]
    b_x = tl.load(x + p, mask=m, other=0).to(tl.float32)
    b_dy = tl.load(dy + p, mask=m, other=0).to(tl.float32)
    for i in tl.static_range(1, PARTS):
        # dy holds PARTS partial gradients [PARTS, R, K], summed in order
        # (as reductions.reduce_partials_kernel sums them).
        p_i = (rows + i * R)[:, None] * K + o_k[None, :]
        b_dy += tl.load(dy + p_i, mask=m, other=0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(b_x * b_x, axis=1) + EPS)
    b_y = b_x * rstd[:, None]
    b_dx = (b_dy - b_y * tl.sum(b_y * b_dy, axis=1)[:, None]) * rstd[:, None]
    tl.store(dx + p, b_dx.to(dx.dtype.element_ty), mask=m)


def _blocks(K: int) -> tuple[int, int]:
    bk = max(16, next_power_of_2(K))
    return max(1, _TILE // bk), bk


def forward_plan(src: str, shape: tuple[int, ...], dtype: str, out: str) -> LaunchPlan:
    """``out = l2norm(src)`` over the last axis, both ``shape`` (contiguous)
    and ``dtype``."""
    K = shape[-1]
    rows = prod(shape) // max(K, 1)
    br, bk = _blocks(K)
    return LaunchPlan(
        kernel=l2norm_fwd_kernel,
        grid=(cdiv(rows, br),),
        params=(In(src), rows),
        outputs=(OutputSpec(tuple(shape), dtype),),
        output_names=(out,),
        constexprs=dict(K=K, EPS=L2NORM_EPS, BR=br, BK=bk),
        num_warps=4,
        num_stages=1,
    )


def backward_plan(
    src: str, grad: str, shape: tuple[int, ...], dtype: str, out: str, parts: int = 1
) -> LaunchPlan:
    """``out`` (``shape``, ``dtype``): the gradient of ``src`` pulled back
    through the normalisation from ``grad`` (the normalised rows'; with
    ``parts`` > 1 the sum of ``grad [parts, *shape]``'s partials)."""
    K = shape[-1]
    rows = prod(shape) // max(K, 1)
    br, bk = _blocks(K)
    return LaunchPlan(
        kernel=l2norm_bwd_kernel,
        grid=(cdiv(rows, br),),
        params=(In(src), In(grad), rows),
        outputs=(OutputSpec(tuple(shape), dtype),),
        output_names=(out,),
        constexprs=dict(K=K, EPS=L2NORM_EPS, BR=br, BK=bk, PARTS=parts),
        num_warps=4,
        num_stages=1,
    )
