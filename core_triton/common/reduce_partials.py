"""Sum float32 partial results over their leading axis and cast.

``x``: ``[P, M]`` float32 (contiguous; ``M`` = elements of the result) →
``out``: ``[M]`` in the output's dtype.  Kernels that split a reduction
across programs (value tiles of the recurrent backward, for instance) write
partials here so that the sum has a fixed order: both bindings, and every
run, get the same bits.
"""

import triton.language as tl

from core_triton.common.launch import In, LaunchPlan, OutputSpec
from core_triton.common.runtime import jit
from core_triton.common.utils import cdiv, prod

_BLOCK = 1024


@jit(sizes=("M",))
def reduce_partials_kernel(x, M, out, P: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(P):
        acc += tl.load(x + p * M + offs, mask=mask, other=0)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


def plan(name: str, parts: int, shape: tuple[int, ...], dtype: str, output_name: str) -> LaunchPlan:
    """Sum input ``name`` (``[parts, *shape]`` float32) into ``output_name``
    (``shape``, ``dtype``)."""
    M = prod(shape)
    return LaunchPlan(
        kernel=reduce_partials_kernel,
        grid=(cdiv(M, _BLOCK),),
        params=(In(name), M),
        outputs=(OutputSpec(tuple(shape), dtype),),
        constexprs=dict(P=parts, BLOCK=_BLOCK),
        num_warps=4,
        num_stages=1,
        output_names=(output_name,),
    )
