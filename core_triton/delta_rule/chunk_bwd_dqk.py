"""Backward of the chunk-parallel gated delta rule, per chunk: the query
and key gradients, and the gradient of the in-chunk cumulative log decay.

The decayed scores and Gram matrix (chunk_intra.py) pull back through
``P[i, j] = sum_k q_i E k_j`` and ``G[i, j] = sum_k k_i E k_j`` (``E =
exp(b_i - b_j)``, per channel for ``gk``) from ``dp`` and ``dg``
(chunk_bwd_dv.py):

    dq_i  += sum_j dP[i, j] E k_j                  ("+b" side)
    dkp_i += sum_j dG[i, j] E k_j                  ("+b" side)
    dkm_j += sum_i (dP[i, j] E q_i + dG[i, j] E k_i) ("-b" side)

to which the extras of chunk_bwd_dv.py are added; then ``dk = dkp + dkm``
and the gradient of ``b`` (the decay from the chunk's start to each token)
is ``db = q dq + k (dkp - dkm)`` per key channel, plus ``dblast`` on the
chunk's last token (summed over channels for scalar gates).  The gate's
gradient is then the reverse in-chunk cumsum of ``db`` (a launch of the
cumsum kernel).

One program per (K tile, chunk slot, batch row x value head), one block of
``BC`` rows at a time: the rows' own side (columns at or before them) and
the column side (rows at or after them).  Scalar gates form ``E`` per block
pair; per-channel gates go through each row block's first row
(chunk_common.py) and sum diagonal blocks column by column.

Outputs: ``dq``, ``dk`` ``[G, B*T, HK, K]`` float32 (one part per value
head of a key head's group, summed by a reduction launch), ``db`` (``[NK,
B*T, HV]`` partials over K tiles for scalar gates, ``[B*T, HV, K]``
per-channel gates).
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot
from core_triton.delta_rule.chunk_common import rows_tile


@triton.jit
def _pair_decay(b_r, b_c, keep):
    """``exp(b_r[i] - b_c[j])`` where ``keep``, else 0 (scalar gates)."""
    return tl.exp(tl.where(keep, b_r[:, None] - b_c[None, :], float("-inf")))


@jit(sizes=("T", "N", "n_iter", "NT", "NS", "ROWS"))
def delta_chunk_bwd_dqk_kernel(
    q,
    k,
    gc,
    dp,
    dg,
    dq_extra,
    dkp_extra,
    dkm_extra,
    dblast,
    cu_seqlens,
    chunk_offsets,
    T,
    N,
    n_iter,
    NT,
    NS,
    ROWS,
    dq,
    dk,
    db,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    GATE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    NC: tl.constexpr = BT // BC
    G: tl.constexpr = HV // HK
    i_k = tl.program_id(0)
    i_s = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // HV
    i_h = i_bh % HV
    i_hk = i_h // G
    _, _, _, ts, te, slot = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input
    o_c = tl.arange(0, BC)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    last = te - 1
    part = (i_h % G).to(tl.int64) * ROWS

    for X in tl.static_range(NC):
        o_x = ts + X * BC + o_c
        m_x = o_x < te
        b_qx = rows_tile(q, o_x, m_x, HK, i_hk, K, o_k, m_k).to(tl.float32)
        b_kx = rows_tile(k, o_x, m_x, HK, i_hk, K, o_k, m_k).to(tl.float32)
        if GATE == 1:
            b_bx = tl.load(gc + o_x * HV + i_h, mask=m_x, other=0)
        else:
            b_bx = rows_tile(gc, o_x, m_x, HV, i_h, K, o_k, m_k)
        acc_q = tl.zeros([BC, BK], dtype=tl.float32)
        acc_p = tl.zeros([BC, BK], dtype=tl.float32)
        acc_m = tl.zeros([BC, BK], dtype=tl.float32)
        # The rows' own side: blocks J <= X.
        for J in tl.static_range(NC):
            if J <= X:
                o_j = ts + J * BC + o_c
                m_j = o_j < te
                p_blk = (o_x[:, None] * HV + i_h) * BT + J * BC + o_c[None, :]
                b_dp = tl.load(dp + p_blk, mask=m_x[:, None], other=0)
                b_dg = tl.load(dg + p_blk, mask=m_x[:, None], other=0)
                if GATE == 2:
                    if J < X:
                        r = tl.minimum(ts + X * BC, last)
                        b_br = tl.load(gc + (r * HV + i_h) * K + o_k, mask=m_k, other=0)
                        b_kj = rows_tile(k, o_j, m_j, HK, i_hk, K, o_k, m_k).to(tl.float32)
                        b_bj = rows_tile(gc, o_j, m_j, HV, i_h, K, o_k, m_k)
                        b_kj = b_kj * tl.exp(tl.where(m_j[:, None], b_br[None, :] - b_bj, 0.0))
                        e_x = tl.exp(tl.where(m_x[:, None], b_bx - b_br[None, :], 0.0))
                        acc_q += dot(b_dp, b_kj, PREC) * e_x
                        acc_p += dot(b_dg, b_kj, PREC) * e_x
                    else:
                        for jj in range(0, BC):
                            row_j = ts + J * BC + jj
                            m_kj = o_k < tl.where(
                                row_j < te, K, 0
                            )  # (a vector test: the interpreter refuses a scalar in a mask)
                            c_kj = tl.load(k + (row_j * HK + i_hk) * K + o_k, mask=m_kj, other=0).to(
                                tl.float32
                            )
                            c_bj = tl.load(gc + (row_j * HV + i_h) * K + o_k, mask=m_kj, other=0)
                            seen = (o_c >= jj) & m_x
                            e = tl.exp(tl.where(seen[:, None], b_bx - c_bj[None, :], float("-inf")))
                            c_dp = tl.load(dp + (o_x * HV + i_h) * BT + J * BC + jj, mask=m_x, other=0)
                            c_dg = tl.load(dg + (o_x * HV + i_h) * BT + J * BC + jj, mask=m_x, other=0)
                            acc_q += c_dp[:, None] * c_kj[None, :] * e
                            acc_p += c_dg[:, None] * c_kj[None, :] * e
                else:
                    b_kj = rows_tile(k, o_j, m_j, HK, i_hk, K, o_k, m_k)
                    keep = m_x[:, None] & m_j[None, :]
                    if J == X:
                        keep = keep & (o_c[:, None] >= o_c[None, :])
                    e = tl.zeros([BC, BC], dtype=tl.float32) + 1.0
                    if GATE == 1:
                        b_bj = tl.load(gc + o_j * HV + i_h, mask=m_j, other=0)
                        e = _pair_decay(b_bx, b_bj, keep)
                    else:
                        e = tl.where(keep, e, 0.0)
                    acc_q += dot((b_dp * e).to(b_kj.dtype), b_kj, PREC)
                    acc_p += dot((b_dg * e).to(b_kj.dtype), b_kj, PREC)
        # The column side: blocks I >= X.
        for I in tl.static_range(NC):
            if I >= X:
                o_i = ts + I * BC + o_c
                m_i = o_i < te
                # dP and dG of rows I, columns X, transposed: element (x, i).
                p_blk_t = (o_i[None, :] * HV + i_h) * BT + X * BC + o_c[:, None]
                b_dpt = tl.load(dp + p_blk_t, mask=m_i[None, :], other=0)
                b_dgt = tl.load(dg + p_blk_t, mask=m_i[None, :], other=0)
                if GATE == 2:
                    if I > X:
                        r = tl.minimum(ts + I * BC, last)
                        b_br = tl.load(gc + (r * HV + i_h) * K + o_k, mask=m_k, other=0)
                        b_bi = rows_tile(gc, o_i, m_i, HV, i_h, K, o_k, m_k)
                        e_i = tl.exp(tl.where(m_i[:, None], b_bi - b_br[None, :], 0.0))
                        b_qi = rows_tile(q, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * e_i
                        b_ki = rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * e_i
                        e_x = tl.exp(tl.where(m_x[:, None], b_br[None, :] - b_bx, 0.0))
                        acc_m += (dot(b_dpt, b_qi, PREC) + dot(b_dgt, b_ki, PREC)) * e_x
                    else:
                        for ii in range(0, BC):
                            row_i = ts + I * BC + ii
                            m_ki = o_k < tl.where(row_i < te, K, 0)
                            c_qi = tl.load(q + (row_i * HK + i_hk) * K + o_k, mask=m_ki, other=0).to(
                                tl.float32
                            )
                            c_ki = tl.load(k + (row_i * HK + i_hk) * K + o_k, mask=m_ki, other=0).to(
                                tl.float32
                            )
                            c_bi = tl.load(gc + (row_i * HV + i_h) * K + o_k, mask=m_ki, other=0)
                            m_xi = o_x < tl.where(row_i < te, te, ts)
                            seen = (o_c <= ii) & m_xi
                            e = tl.exp(tl.where(seen[:, None], c_bi[None, :] - b_bx, float("-inf")))
                            p_row = (row_i * HV + i_h) * BT + X * BC + o_c
                            r_dp = tl.load(dp + p_row, mask=m_xi, other=0)
                            r_dg = tl.load(dg + p_row, mask=m_xi, other=0)
                            acc_m += (r_dp[:, None] * c_qi[None, :] + r_dg[:, None] * c_ki[None, :]) * e
                else:
                    b_qi = rows_tile(q, o_i, m_i, HK, i_hk, K, o_k, m_k)
                    b_ki = rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k)
                    keep = m_x[:, None] & m_i[None, :]
                    if I == X:
                        keep = keep & (o_c[:, None] <= o_c[None, :])
                    e = tl.zeros([BC, BC], dtype=tl.float32) + 1.0
                    if GATE == 1:
                        b_bi = tl.load(gc + o_i * HV + i_h, mask=m_i, other=0)
                        e = tl.exp(tl.where(keep, b_bi[None, :] - b_bx[:, None], float("-inf")))
                    else:
                        e = tl.where(keep, e, 0.0)
                    acc_m += dot((b_dpt * e).to(b_qi.dtype), b_qi, PREC)
                    acc_m += dot((b_dgt * e).to(b_ki.dtype), b_ki, PREC)
        p_x = (o_x[:, None] * HV + i_h) * K + o_k[None, :]
        m_xk = m_x[:, None] & m_k[None, :]
        acc_q += tl.load(dq_extra + p_x, mask=m_xk, other=0)
        acc_p += tl.load(dkp_extra + p_x, mask=m_xk, other=0)
        acc_m += tl.load(dkm_extra + p_x, mask=m_xk, other=0)
        p_out = ((part + o_x[:, None]) * HK + i_hk) * K + o_k[None, :]
        tl.store(dq + p_out, acc_q, mask=m_xk)
        tl.store(dk + p_out, acc_p + acc_m, mask=m_xk)
        if GATE != 0:
            d_b = b_qx * acc_q + b_kx * (acc_p - acc_m)
            is_last = (o_x == last)[:, None]
            if GATE == 1:
                d_b = tl.sum(d_b, axis=1)
                d_last = tl.load(dblast + (i_k.to(tl.int64) * NS + slot) * HV + i_h)
                d_b += tl.where(o_x == last, d_last, 0.0)
                tl.store(db + (i_k.to(tl.int64) * ROWS + o_x) * HV + i_h, d_b, mask=m_x)
            else:
                d_last = tl.load(dblast + (slot * HV + i_h) * K + o_k, mask=m_k, other=0)
                d_b += tl.where(is_last, d_last[None, :], 0.0)
                tl.store(db + p_x, d_b, mask=m_xk)
