"""Fixed-order reductions: both bindings, and every run, get the same bits.

Two kernels, because their sums run in different orders over different
axes (one kernel for both would change the bits of one of them, or make a
data size a compile-time constant):

* ``reduce_partials``: ``x [P, M]`` float32 (contiguous; ``M`` = elements
  of the result) -> ``out [M]`` in the output's dtype, the ``P`` partials
  (a count of tiles, never a data size) added in order.  Kernels that split
  a reduction across programs (value tiles of the recurrent backward, for
  instance) write partials here so that the sum has a fixed order.
* ``head_sum``: column sums of a ``[R, F]`` float32 matrix: the gradient of
  a per-head constant (``g_gamma [H]``) from a per-token gradient
  (``[B*T, H]``).  Two launches of one kernel, in a fixed order: program
  ``(f, p)`` sums rows ``[p * RC, (p + 1) * RC)`` of column tile ``f`` in
  blocks of ``BR`` and writes row ``p`` of its output.  The first launch
  spreads the rows over ``P`` programs (one program alone took 50 us for
  16k rows on the H100); the second sums the ``[P, F]`` partials with
  ``P = 1``.  The last output has the parameter's dtype.  ``groups``
  matrices side by side (``[R, groups * F]``) get each group's column sums
  in the same two launches, with the bits one group alone gets: a folded
  ``vmap`` (jax_api._fold) sums a per-head gradient per element this way.
"""

import triton.language as tl

from core_triton.common.launch import In, LaunchPlan, OutputSpec
from core_triton.common.runtime import jit
from core_triton.common.utils import cdiv, next_power_of_2, prod

_BLOCK = 1024


@jit(sizes=("M",))
def reduce_partials_kernel(x, M, out, P: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(P):
        acc += tl.load(x + p * M + offs, mask=mask, other=0)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


def reduce_partials_plan(
    name: str, parts: int, shape: tuple[int, ...], dtype: str, output_name: str
) -> LaunchPlan:
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


@jit(sizes=("R", "RC"))
def head_sum_kernel(x, R, RC, out, F: tl.constexpr, BR: tl.constexpr, BF: tl.constexpr):
    o_f = tl.program_id(0) * BF + tl.arange(0, BF)
    i_p = tl.program_id(1).to(tl.int64)
    m_f = o_f < F
    r0 = i_p * RC
    r1 = tl.minimum(r0 + RC, R)
    acc = tl.zeros([BR, BF], dtype=tl.float32)
    for i in range(0, tl.cdiv(RC, BR)):
        o_r = r0 + i * BR + tl.arange(0, BR).to(tl.int64)
        m = (o_r < r1)[:, None] & m_f[None, :]
        acc += tl.load(x + o_r[:, None] * F + o_f[None, :], mask=m, other=0).to(tl.float32)
    tl.store(out + i_p * F + o_f, tl.sum(acc, axis=0).to(out.dtype.element_ty), mask=m_f)


def head_sum_plans(
    src: str, rows: int, features: int, dtype: str, output_name: str, interpreted: bool, groups: int = 1
):
    """The two launches that sum input ``src`` (``[rows, features]`` float32)
    over its rows into ``output_name`` (``[features]``, ``dtype``).

    ``groups``: ``src`` is ``[rows, groups * features]``, that many
    matrices side by side, and ``output_name`` is ``[groups * features]``.
    The blocks (``BF``, ``BR``, ``P``) are those of one group alone, so every
    column is summed in the order, and in the tile shape, of the ungrouped
    launch: each group gets the ungrouped bits.

    ``rows`` (a token count, or sequences times value tiles) reaches the
    kernel as a run-time argument and sets only the grid: a new number of
    tokens or packed sequences compiles nothing new."""
    bf = min(next_power_of_2(features), 64)
    width = groups * features
    # Rows per block: small under the interpreter, so that the tests' short
    # inputs still spread over several programs.
    br = 16 if interpreted else max(16, min(64, 4096 // bf))
    # Pass 1: about 4 row blocks per program, at least 2 and at most 1024
    # programs; pass 2 sums the partials.  No run-time size is 1 (at least 2
    # programs, at least 2 rows each): jax-triton makes an int equal to 1 a
    # constant, which would compile another variant of the kernel.
    P = max(2, min(1024, cdiv(rows, 4 * br)))
    passes = (
        (rows, max(2, cdiv(rows, P)), P, src, OutputSpec((P, width), "float32"), f"{output_name}_parts"),
        (P, P, 1, f"{output_name}_parts", OutputSpec((width,), dtype), output_name),
    )
    return tuple(
        LaunchPlan(
            kernel=head_sum_kernel,
            grid=(cdiv(width, bf), programs),
            params=(In(name), n_rows, rows_each),
            outputs=(spec,),
            output_names=(out,),
            constexprs=dict(F=width, BR=br, BF=bf),
        )
        for n_rows, rows_each, programs, name, spec, out in passes
    )


def head_sum_source(steps, output_name: str) -> tuple[str, int, int, str] | None:
    """``(src, rows, features, dtype)`` of the launch pair of
    :func:`head_sum_plans` in ``steps`` that writes ``output_name``, or None
    if there is none."""
    by_output = {s.output_names[0]: s for s in steps if s.kernel is head_sum_kernel}
    first, last = by_output.get(f"{output_name}_parts"), by_output.get(output_name)
    if first is None or last is None:
        return None
    return first.params[0].name, first.params[1], first.constexprs["F"], last.outputs[0].dtype
