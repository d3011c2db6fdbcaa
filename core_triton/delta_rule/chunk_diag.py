"""The diagonal ``BC x BC`` blocks of the decayed scores ``P`` and key Gram
matrix ``G`` of the chunk-parallel gated delta rule for per-channel gates.

(chunk_intra.py defines them and forms the blocks below the diagonal.)
The diagonal blocks are the costly ones: a block's decays go through its
middle row, both ways (chunk_common.diagonal_tile), or column by column
where they are too strong for that.  One small program per (chunk slot,
batch row x value head, block ``I``), several per SM, so that they never
hold up the intra kernel's chunk-wide programs, whose registers go to the
block pairs below the diagonal and the inverse (H100, KDA HV32 K=V=128
bf16: 0.29 + 0.59 ms at B4 T4k and 0.51 + 1.20 at B1 T32k in 16
documents, where block rows of P and G in one launch and the inverse in
another took 0.89 + 0.21 and 1.73 + 0.40).

Outputs: ``pdiag``, ``gdiag`` ``[B*T, HV, BC]`` float32: row ``i`` of block
``I`` holds its ``BC`` columns of block ``(I, I)`` (``P`` with its
diagonal, 0 above it; ``G`` 0 from it on, and past the chunk's end).  Rows
of no chunk are not written (nothing reads them).
"""

import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import diagonal_tile, rows_tile, slot_chunk


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_diag_kernel(
    q,
    k,
    gc,
    cu_seqlens,
    chunk_offsets,
    T,
    N,
    n_iter,
    NT,
    NS,
    pdiag,
    gdiag,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    I = tl.program_id(2)
    i_s, i_bh = tl.program_id(0), tl.program_id(1)
    i_h, i_hk, ts, te, _ = slot_chunk(
        cu_seqlens, chunk_offsets, i_s, i_bh, T, N, n_iter, NT, NS, HK, HV, BT, IS_VARLEN
    )
    r = ts + I * BC  # block I's first row
    if r >= te:
        return  # a spare slot of packed input, or a block past the chunk's end
    o_c = tl.arange(0, BC)
    o_i = r + o_c
    m_i = o_i < te
    acc_p = tl.zeros([BC, BC], dtype=tl.float32)
    acc_g = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = rows_tile(q, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32)
        b_ki = rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32)
        b_bi = rows_tile(gc, o_i, m_i, HV, i_h, K, o_k, m_k)
        acc_p, acc_g = diagonal_tile(q, k, gc, b_q, b_ki, b_bi, acc_p, acc_g, ts, te, i_h, i_hk, I, o_i, m_i,
                                     HK, HV, K, BC, o_k, m_k, PREC)  # fmt: skip
    keep = m_i[:, None] & m_i[None, :]
    p_blk = (o_i[:, None] * HV + i_h) * BC + o_c[None, :]
    tl.store(pdiag + p_blk, tl.where(keep & (o_c[:, None] >= o_c[None, :]), acc_p, 0.0), mask=m_i[:, None])
    tl.store(gdiag + p_blk, tl.where(keep & (o_c[:, None] > o_c[None, :]), acc_g, 0.0), mask=m_i[:, None])
