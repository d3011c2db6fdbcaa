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
chunk's last token (summed over channels for scalar gates).  Terms whose
two halves in ``db`` cancel exactly (``P``'s diagonal, where ``E = 1``, and
the last token's own term of the chunk state's decay) stay out of ``db``:
rounded separately they would not cancel, and with strong decays they are
much larger than the gradient that remains.  For ``gk`` the gate's
gradient is then the reverse in-chunk cumsum of ``db`` (a launch of the
cumsum kernel); for ``g`` the kernel sums it per token directly
(scalar_gate_grad, which avoids the cancellation altogether).

One program per (K tile, chunk slot, batch row x value head), one block of
``BC`` rows at a time: the rows' own side (columns at or before them) and
the column side (rows at or after them).  Scalar gates form ``E`` per block
pair; per-channel gates go through each row block's first row, and
diagonal blocks through their middle row where the decays allow it, else
column by column (chunk_common.py).

Outputs: ``dq``, ``dk`` ``[G, B*T, HK, K]`` float32 (one part per value
head of a key head's group, summed by a reduction launch); for scalar
gates the gate's gradient itself (``[NK, B*T, HV]`` partials over K tiles:
scalar_gate_grad sums it without a cumsum), for per-channel gates ``db
[B*T, HV, K]`` float32, or with ``SUM_DB`` ``gk``'s gradient itself (its
reverse in-chunk cumsum, in ``gk``'s dtype; the row blocks walked last
first).
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import diagonal_split, rows_tile, slot_chunk


@triton.jit
def _pair_decay(b_r, b_c, keep):
    """``exp(b_r[i] - b_c[j])`` where ``keep``, else 0 (scalar gates)."""
    return tl.exp(tl.where(keep, b_r[:, None] - b_c[None, :], float("-inf")))


@jit(sizes=("T", "N", "n_iter", "NT", "NS", "ROWS"))
def delta_chunk_bwd_dqk_kernel(
    q,
    k,
    gc,
    aqk,
    gkk,
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
    SUM_DB: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    NC: tl.constexpr = BT // BC
    G: tl.constexpr = HV // HK
    i_k = tl.program_id(0)
    i_s, i_bh = tl.program_id(1), tl.program_id(2)
    i_h, i_hk, ts, te, slot = slot_chunk(
        cu_seqlens, chunk_offsets, i_s, i_bh, T, N, n_iter, NT, NS, HK, HV, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input
    o_c = tl.arange(0, BC)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    last = te - 1
    part = (i_h % G).to(tl.int64) * ROWS
    # SUM_DB: db of the rows after this block (its blocks walked last first).
    db_after = tl.zeros([BK], dtype=tl.float32)

    for XX in tl.static_range(NC):
        X = XX
        if SUM_DB:
            X = NC - 1 - XX
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
        if GATE == 2:
            # The diagonal block's decays as products, where they fit.
            fits, _, e_d, f_d = diagonal_split(gc, b_bx, m_x, ts, te, X, i_h, HV, K, BC, o_k, m_k)
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
                    elif fits:
                        # exp(b_x - b_j) = e[x] * f[j] (chunk_common.diagonal_split).
                        low = m_x[:, None] & m_x[None, :] & (o_c[:, None] > o_c[None, :])
                        b_kf = b_kx * f_d
                        acc_q += dot(tl.where(low, b_dp, 0.0), b_kf, PREC) * e_d
                        acc_p += dot(tl.where(low, b_dg, 0.0), b_kf, PREC) * e_d
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
                            seen = (o_c > jj) & m_x
                            e = tl.exp(tl.where(seen[:, None], b_bx - c_bj[None, :], float("-inf")))
                            c_dp = tl.load(dp + (o_x * HV + i_h) * BT + J * BC + jj, mask=m_x, other=0)
                            c_dg = tl.load(dg + (o_x * HV + i_h) * BT + J * BC + jj, mask=m_x, other=0)
                            acc_q += c_dp[:, None] * c_kj[None, :] * e
                            acc_p += c_dg[:, None] * c_kj[None, :] * e
                else:
                    b_kj = rows_tile(k, o_j, m_j, HK, i_hk, K, o_k, m_k)
                    keep = m_x[:, None] & m_j[None, :]
                    if J == X:
                        keep = keep & (o_c[:, None] > o_c[None, :])
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
                    elif fits:
                        # exp(b_i - b_x) = e[i] * f[x]: (x, i) pairs with i > x.
                        up = m_x[:, None] & m_x[None, :] & (o_c[:, None] < o_c[None, :])
                        acc_m += (
                            dot(tl.where(up, b_dpt, 0.0), b_qx * e_d, PREC)
                            + dot(tl.where(up, b_dgt, 0.0), b_kx * e_d, PREC)
                        ) * f_d
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
                            seen = (o_c < ii) & m_xi
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
                        keep = keep & (o_c[:, None] < o_c[None, :])
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
        x_q = tl.load(dq_extra + p_x, mask=m_xk, other=0)
        x_p = tl.load(dkp_extra + p_x, mask=m_xk, other=0)
        x_m = tl.load(dkm_extra + p_x, mask=m_xk, other=0)
        # The diagonal of P (exp(b_i - b_i) = 1), apart: it adds to dq_i and
        # dk_i but its two terms in db_i cancel exactly, and rounded they
        # would not (the loops above leave it out).
        d_pp = tl.load(dp + (o_x * HV + i_h) * BT + X * BC + o_c, mask=m_x, other=0)
        acc_q += x_q
        acc_p += x_p
        p_out = ((part + o_x[:, None]) * HK + i_hk) * K + o_k[None, :]
        tl.store(dq + p_out, acc_q + d_pp[:, None] * b_kx, mask=m_xk)
        tl.store(dk + p_out, acc_p + acc_m + x_m + d_pp[:, None] * b_qx, mask=m_xk)
        if GATE == 2:
            # The last token's own term of the state's decay cancels likewise
            # (dblast leaves it out too).
            is_last = (o_x == last)[:, None]
            d_b = b_qx * acc_q + b_kx * (acc_p - acc_m - tl.where(is_last, 0.0, x_m))
            d_last = tl.load(dblast + (slot * HV + i_h) * K + o_k, mask=m_k, other=0)
            d_b += tl.where(is_last, d_last[None, :], 0.0)
            if SUM_DB:
                # gk's gradient itself: the reverse in-chunk cumsum of db.
                d_b = tl.where(m_x[:, None], d_b, 0.0)
                sums = tl.cumsum(d_b, axis=0, reverse=True) + db_after[None, :]
                db_after += tl.sum(d_b, axis=0)
                tl.store(db + p_x, sums.to(db.dtype.element_ty), mask=m_xk)
            else:
                tl.store(db + p_x, d_b, mask=m_xk)
    if GATE == 1:
        scalar_gate_grad(
            q, k, aqk, gkk, dp, dg, dq_extra, dkp_extra, dkm_extra, dblast, db, ts, te, slot, i_k, i_h, i_hk,
            NS, ROWS, HK, HV, K, BT, BK,
        )  # fmt: skip


@triton.jit
def scalar_gate_grad(
    q, k, aqk, gkk, dp, dg, dq_extra, dkp_extra, dkm_extra, dblast, out, ts, te, slot, i_k, i_h, i_hk,
    NS, ROWS, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """The gradient of a scalar gate ``g`` over one chunk, this K tile's part
    (``out [NK, B*T, HV]``), summed directly rather than as a reverse
    cumsum of per-token terms: ``g_t`` enters every ``b_i`` with ``i >= t``,
    so

        dg_t = sum_{i >= t} plus_i                 (q exp(b) S terms: "+b_i" only)
             + sum_{j < t} kx_j                    (Kd = k exp(b_last - b_j): "-b_j", "+b_last")
             + sum_{i >= t > j} dP P + dG G        (pairs: "+b_i", "-b_j")
             + exp(b_last) sum(S * dS')            (the state's own decay)

    A cumsum of ``db`` would add each pair's two opposite terms and leave
    their rounding, which with strong decays is larger than ``dg`` (seen:
    1e-5 relative error against 1e-7 here).  The pair sum (K-independent)
    comes with K tile 0."""
    o_tt = tl.arange(0, BT)
    o_t = ts + o_tt
    m_t = o_t < te
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    p_x = (o_t[:, None] * HV + i_h) * K + o_k[None, :]
    b_q = rows_tile(q, o_t, m_t, HK, i_hk, K, o_k, m_k).to(tl.float32)
    b_k = rows_tile(k, o_t, m_t, HK, i_hk, K, o_k, m_k).to(tl.float32)
    plus = tl.sum(b_q * tl.load(dq_extra + p_x, mask=m_tk, other=0), axis=1)
    plus += tl.sum(b_k * tl.load(dkp_extra + p_x, mask=m_tk, other=0), axis=1)
    # kx of the token before each row (0 for the first): an inclusive cumsum
    # of it is the exclusive one of kx, with nothing subtracted.
    o_p = o_t - 1
    m_p = m_t & (o_tt > 0)
    m_pk = m_p[:, None] & m_k[None, :]
    b_kp = rows_tile(k, o_p, m_p, HK, i_hk, K, o_k, m_k).to(tl.float32)
    kx = tl.sum(
        b_kp * tl.load(dkm_extra + (o_p[:, None] * HV + i_h) * K + o_k[None, :], mask=m_pk, other=0), 1
    )
    d_g = tl.cumsum(plus, axis=0, reverse=True) + tl.cumsum(kx, axis=0)
    d_g += tl.load(dblast + (i_k.to(tl.int64) * NS + slot) * HV + i_h)
    if i_k == 0:
        p_mat = (o_t[:, None] * HV + i_h) * BT + o_tt[None, :]
        lower = m_t[:, None] & (o_tt[None, :] < o_tt[:, None])
        # (P in float32, or float16: chunk.P_FLOAT16)
        b_p = tl.load(aqk + p_mat, mask=lower, other=0).to(tl.float32)
        pairs = tl.load(dp + p_mat, mask=lower, other=0) * b_p
        pairs += tl.load(dg + p_mat, mask=lower, other=0) * tl.load(gkk + p_mat, mask=lower, other=0)
        # [t, j] = sum_{i >= t} pairs[i, j], then j < t.
        suffix = tl.cumsum(pairs, axis=0, reverse=True)
        d_g += tl.sum(tl.where(o_tt[None, :] < o_tt[:, None], suffix, 0.0), axis=1)
    tl.store(out + (i_k.to(tl.int64) * ROWS + o_t) * HV + i_h, d_g, mask=m_t)
