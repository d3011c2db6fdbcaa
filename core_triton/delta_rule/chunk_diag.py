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

With ``GC_HERE`` the launch also forms ``gc`` (chunk.CUMSUM_IN_DIAG): ``g``
is then ``gk`` itself ``[B*T, HV, K]`` (any float dtype), and each block's
program writes its rows of the in-chunk cumsum ``gc`` (float32, each K
tile: one inclusive scan of the chunk's rows up to the block's last, the
same scan in every block's program), then reads them back after a barrier
as the launch without it reads ``gc``; no cumsum launch runs before it
(whose output this launch would read again).  Its grid then takes the block fastest, ``(BT / BC,
slots, batch rows x value heads)``, so that a chunk's four programs, which
each read the chunk's earlier rows, run side by side and share them
through L2.
"""

import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import diagonal_tile, rows_tile, slot_chunk


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_diag_kernel(
    q,
    k,
    g,
    cu_seqlens,
    chunk_offsets,
    T,
    N,
    n_iter,
    NT,
    NS,
    pdiag,
    gdiag,
    gc_out,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    GC_HERE: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    if GC_HERE:
        I = tl.program_id(0)
        i_s, i_bh = tl.program_id(1), tl.program_id(2)
        gc = gc_out
    else:
        I = tl.program_id(2)
        i_s, i_bh = tl.program_id(0), tl.program_id(1)
        gc = g
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
        if GC_HERE:
            # The chunk's cumsum up to this block's last row, one scan of the
            # chunk-wide tile (rows after it masked: they change no earlier
            # prefix), so that every block's program forms its rows as the
            # same scan does, and b_i - b_j of rows in neighbouring blocks
            # carries no more rounding than within a block (a separate sum
            # of the earlier rows took a strong-decay test's float32 d_gk
            # from under 1e-5 of its scale to 2.6e-5).  This block's rows
            # are stored, then read back after a barrier (as diagonal_tile
            # reads its middle row and the tile transposed).
            o_c0 = ts + tl.arange(0, BT)
            m_c0 = (o_c0 < r + BC) & (o_c0 < te)
            b_cum = tl.cumsum(rows_tile(g, o_c0, m_c0, HV, i_h, K, o_k, m_k).to(tl.float32), axis=0)
            mine = (o_c0 >= r) & m_c0
            p_gc = gc + (o_c0[:, None] * HV + i_h) * K + o_k[None, :]
            tl.store(p_gc, b_cum, mask=mine[:, None] & m_k[None, :])
            tl.debug_barrier()
        b_bi = rows_tile(gc, o_i, m_i, HV, i_h, K, o_k, m_k)
        acc_p, acc_g = diagonal_tile(q, k, gc, b_q, b_ki, b_bi, acc_p, acc_g, ts, te, i_h, i_hk, I, o_i, m_i,
                                     HK, HV, K, BC, o_k, m_k, PREC)  # fmt: skip
    keep = m_i[:, None] & m_i[None, :]
    p_blk = (o_i[:, None] * HV + i_h) * BC + o_c[None, :]
    tl.store(pdiag + p_blk, tl.where(keep & (o_c[:, None] >= o_c[None, :]), acc_p, 0.0), mask=m_i[:, None])
    tl.store(gdiag + p_blk, tl.where(keep & (o_c[:, None] > o_c[None, :]), acc_g, 0.0), mask=m_i[:, None])
