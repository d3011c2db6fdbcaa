"""The decayed scores ``P`` and key Gram matrix ``G`` of the chunk-parallel
gated delta rule for per-channel gates, one block row per program.

(chunk_intra.py defines them.)  Per-channel gates cannot form ``P`` and
``G`` as whole-chunk products: their ``BC x BC`` blocks go through a
reference row (chunk_common.py).  One program per (chunk slot, batch row x
value head, block row ``I``), so that the work spreads over four times the
programs of the intra kernel, each small (few registers, several programs
per SM): for each column block ``J < I`` the products through block
``I``'s first row, the diagonal block through its middle row where the
decays allow it (else column by column), zeros above it.  The intra kernel
then reads ``G`` back for the inverse (H100, KDA B4 T4k HV32 K=V=128 bf16,
one call: forward 2.50 ms against 2.73 with ``P`` and ``G`` formed in the
intra kernel, forward+backward 14.20 against 14.69; K tiles of 32 and 2
warps, chunk.py's "gram" tiles: 148 registers a thread, six programs per
SM, where the intra kernel's whole chunk took 254 at 4 warps, two).

Outputs: ``aqk``, ``gkk`` ``[B*T, HV, BT]`` float32, every column of the
program's rows written (0 above the diagonal and past the chunk's end).
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot
from core_triton.delta_rule.chunk_common import decayed_keys_t, diagonal_tile, rows_tile


@triton.jit
def _off_diagonal(q, k, gc, ts, te, i_h, i_hk, o_i, m_i, r, J, HK: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Block ``(I, J)``, ``J < I``, of ``P`` and ``G`` (rows ``o_i`` of
    block ``I``, ``r`` its first row): ``exp(b_i - b_r) * exp(b_r - b_j)``,
    both at most 1."""
    o_j = ts + J * BC + tl.arange(0, BC)
    m_j = o_j < te
    acc_p = tl.zeros([BC, BC], dtype=tl.float32)
    acc_g = tl.zeros([BC, BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_br = tl.load(gc + (r * HV + i_h) * K + o_k, mask=m_k, other=0)
        e_i = tl.exp(
            tl.where(m_i[:, None], rows_tile(gc, o_i, m_i, HV, i_h, K, o_k, m_k) - b_br[None, :], 0.0)
        )
        b_kjt = decayed_keys_t(k, gc, b_br, o_j, m_j, HK, HV, i_hk, i_h, K, o_k, m_k)
        acc_p += dot(rows_tile(q, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * e_i, b_kjt, PREC)
        acc_g += dot(rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * e_i, b_kjt, PREC)
    keep = m_i[:, None] & m_j[None, :]
    return tl.where(keep, acc_p, 0.0), tl.where(keep, acc_g, 0.0)


@triton.jit
def _diagonal(q, k, gc, ts, te, i_h, i_hk, o_i, m_i, I, HK: tl.constexpr, HV: tl.constexpr,
              K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Diagonal block ``I`` of ``P`` (its diagonal included) and ``G``
    (strictly lower)."""
    o_c = tl.arange(0, BC)
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
    acc_p = tl.where(keep & (o_c[:, None] >= o_c[None, :]), acc_p, 0.0)
    acc_g = tl.where(keep & (o_c[:, None] > o_c[None, :]), acc_g, 0.0)
    return acc_p, acc_g


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_gram_kernel(
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
    aqk,
    gkk,
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
    NC: tl.constexpr = BT // BC
    i_s = tl.program_id(0)
    i_bh = tl.program_id(1)
    I = tl.program_id(2)
    i_b = i_bh // HV
    i_h = i_bh % HV
    i_hk = i_h // (HV // HK)
    _, _, _, ts, te, _ = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    r = ts + I * BC  # block I's first row
    if r >= te:
        return  # a spare slot of packed input, or a block past the chunk's end
    o_c = tl.arange(0, BC)
    o_i = r + o_c
    m_i = o_i < te
    for J in tl.static_range(NC):
        if J < I:
            blk_p, blk_g = _off_diagonal(q, k, gc, ts, te, i_h, i_hk, o_i, m_i, r, J, HK, HV, K, BC, BK, PREC)
        elif J == I:
            blk_p, blk_g = _diagonal(q, k, gc, ts, te, i_h, i_hk, o_i, m_i, I, HK, HV, K, BC, BK, PREC)
        else:
            blk_p = tl.zeros([BC, BC], dtype=tl.float32)
            blk_g = tl.zeros([BC, BC], dtype=tl.float32)
        p_blk = (o_i[:, None] * HV + i_h) * BT + J * BC + o_c[None, :]
        tl.store(aqk + p_blk, blk_p, mask=m_i[:, None])
        tl.store(gkk + p_blk, blk_g, mask=m_i[:, None])
