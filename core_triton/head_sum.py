"""Column sums of a ``[R, F]`` float32 matrix: the gradient of a per-head
constant (``g_gamma [H]``) from a per-token gradient (``[B*T, H]``).

Two launches of one kernel, in a fixed order (the same bits in both
bindings, and run to run): program ``(f, p)`` sums rows ``[p * RC, (p + 1)
* RC)`` of column tile ``f`` in blocks of ``BR`` and writes row ``p`` of its
output.  The first launch spreads the rows over ``P`` programs (one program
alone took 50 us for 16k rows on the H100); the second sums the ``[P, F]``
partials with ``P = 1``.  The last output has the parameter's dtype.
"""

import triton
import triton.language as tl


@triton.jit
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
