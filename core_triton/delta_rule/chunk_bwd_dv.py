"""Backward of the chunk-parallel gated delta rule, per chunk: the value
and beta gradients, and everything the query/key gradients need that sums
over V.

Per chunk (chunk_intra.py for P, G, Tinv; with S the state entering it,
``U = Tinv R``, ``R = diag(beta) (v - (k * exp(b)) S)``), from ``dU``
(chunk_bwd_state.py), ``do`` and ``dS'`` (the gradient of the state leaving
the chunk, ``dh[slot]``):

    dR  = Tinv^T dU            dv = beta dR          dL = -dR U^T (strictly lower)
    dP  = scale do U^T (lower) dG = diag(beta) dL
    dbeta = sum_V v dR - sum_K (k exp(b)) (dR S^T) + sum_j dL[:, j] G[:, j]

and, for this program's K tile, the query/key gradient terms that do not
come from P and G (chunk_bwd_dqk.py adds those):

    dq_extra  = scale exp(b) (do S^T)
    dkp_extra = -beta exp(b) (dR S^T)           (through k * exp(b): "+b" side)
    dkm_extra = exp(b_last - b) (U dS'^T)       (through K_e: "-b" side)

and the gate gradient of the chunk's last token from the state's decay:
``exp(b_last) sum(S * dS')`` over this tile's channels for scalar gates,
and per channel ``sum_{j != last} k_j dkm_extra_j + exp(b_last) rowsum(S *
dS')`` for per-channel gates (the last token's own term cancels in its
``db``, chunk_bwd_dqk.py).

One program per (K tile, chunk slot, batch row x value head), looping over
V tiles; the ``[BT, BT]`` terms are the same in every K tile's program and
only the first writes them (and dv).  Outputs: ``dv [B*T, HV, V]``,
``dbeta [NK, B*T, HV]`` (partials over K tiles), ``dp``, ``dg`` ``[B*T,
HV, BT]`` float32, the three extras ``[B*T, HV, K]`` float32, ``dblast``
(``[NK, slots, HV]`` partials for scalar gates, ``[slots, HV, K]`` for
per-channel gates).
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import rows_tile, rows_tile_t, slot_chunk


@jit(sizes=("T", "N", "n_iter", "NT", "NS", "ROWS"))
def delta_chunk_bwd_dv_kernel(
    k,
    v,
    beta,
    gc,
    tinv,
    gkk,
    h,
    u,
    do,
    dh,
    du,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    N,
    n_iter,
    NT,
    NS,
    ROWS,
    dv,
    dbeta,
    dp,
    dg,
    dq_extra,
    dkp_extra,
    dkm_extra,
    dblast,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    i_k = tl.program_id(0)
    i_s, i_bh = tl.program_id(1), tl.program_id(2)
    i_h, i_hk, ts, te, slot = slot_chunk(
        cu_seqlens, chunk_offsets, i_s, i_bh, T, N, n_iter, NT, NS, HK, HV, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input
    o_tt = tl.arange(0, BT)
    o_t = ts + o_tt
    m_t = o_t < te
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    state = (slot * HV + i_h) * K * V
    p_mat = (o_t[:, None] * HV + i_h) * BT + o_tt[None, :]
    lower = m_t[:, None] & (o_tt[None, :] <= o_tt[:, None])
    # Tinv^T loaded as such: element (j, i) = Tinv[i, j], i >= j.
    b_tinvt = tl.load(
        tinv + (o_t[None, :] * HV + i_h) * BT + o_tt[:, None],
        mask=m_t[None, :] & (o_tt[:, None] <= o_tt[None, :]),
        other=0,
    )
    b_beta = tl.load(beta + o_t * HV + i_h, mask=m_t, other=0).to(tl.float32)

    acc_q = tl.zeros([BT, BK], dtype=tl.float32)  # do S^T
    acc_r = tl.zeros([BT, BK], dtype=tl.float32)  # dR S^T
    acc_e = tl.zeros([BT, BK], dtype=tl.float32)  # U dS'^T
    b_dp = tl.zeros([BT, BT], dtype=tl.float32)
    b_dl = tl.zeros([BT, BT], dtype=tl.float32)
    db_v = tl.zeros([BT], dtype=tl.float32)
    sd = tl.zeros([BK], dtype=tl.float32)  # rowsum(S * dS')
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_do = rows_tile(do, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32)
        b_u = rows_tile(u, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32)
        b_ut = rows_tile_t(u, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32)
        b_du = rows_tile(du, o_t, m_t, HV, i_h, V, o_v, m_v)
        # States as [BV, BK] tiles: S^T loaded, not transposed in registers.
        m_vk = m_v[:, None] & m_k[None, :]
        off_vk = o_k[None, :].to(tl.int64) * V + o_v[:, None]
        b_st = tl.load(h + state + off_vk, mask=m_vk, other=0).to(tl.float32)
        b_dst = tl.load(dh + state + off_vk, mask=m_vk, other=0)
        b_dr = dot(b_tinvt, b_du, PREC)
        if i_k == 0:
            b_v = rows_tile(v, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32)
            db_v += tl.sum(b_v * b_dr, axis=1)
            tl.store(
                dv + (o_t[:, None] * HV + i_h) * V + o_v[None, :],
                (b_beta[:, None] * b_dr).to(dv.dtype.element_ty),
                mask=m_t[:, None] & m_v[None, :],
            )
            b_dp += dot(b_do, b_ut, PREC)
            b_dl -= dot(b_dr, b_ut, PREC)
        acc_q += dot(b_do, b_st, PREC)
        acc_r += dot(b_dr, b_st, PREC)
        acc_e += dot(b_u, b_dst, PREC)
        sd += tl.sum(b_st * b_dst, axis=0)

    b_k = rows_tile(k, o_t, m_t, HK, i_hk, K, o_k, m_k).to(tl.float32)
    last = te - 1
    if GATE == 0:
        e_b = tl.zeros([BT, BK], dtype=tl.float32) + 1.0
        e_last = tl.where(m_t, 1.0, 0.0)[:, None] + tl.zeros([BT, BK], dtype=tl.float32)
        d_last = tl.zeros([BK], dtype=tl.float32) + 1.0
    if GATE == 1:
        b_g = tl.load(gc + o_t * HV + i_h, mask=m_t, other=0)
        g_last = tl.load(gc + last * HV + i_h)
        e_b = tl.exp(b_g)[:, None] + tl.zeros([BT, BK], dtype=tl.float32)
        e_last = tl.exp(tl.where(m_t, g_last - b_g, float("-inf")))[:, None] + tl.zeros(
            [BT, BK], dtype=tl.float32
        )
        d_last = tl.zeros([BK], dtype=tl.float32) + tl.exp(g_last)
    if GATE == 2:
        b_gk = rows_tile(gc, o_t, m_t, HV, i_h, K, o_k, m_k)
        g_last = tl.load(gc + (last * HV + i_h) * K + o_k, mask=m_k, other=0)
        e_b = tl.exp(b_gk)
        e_last = tl.exp(tl.where(m_t[:, None], g_last[None, :] - b_gk, float("-inf")))
        d_last = tl.exp(g_last)
    x_q = acc_q * e_b * scale
    x_p = -b_beta[:, None] * e_b * acc_r
    x_m = e_last * acc_e
    p_x = (o_t[:, None] * HV + i_h) * K + o_k[None, :]
    m_x = m_t[:, None] & m_k[None, :]
    tl.store(dq_extra + p_x, x_q, mask=m_x)
    tl.store(dkp_extra + p_x, x_p, mask=m_x)
    tl.store(dkm_extra + p_x, x_m, mask=m_x)
    if GATE == 1:
        # Scalar gates sum the Kd terms per token (chunk_bwd_dqk.py).
        tl.store(dblast + (i_k.to(tl.int64) * NS + slot) * HV + i_h, tl.sum(d_last * sd, axis=0))
    if GATE == 2:
        # The last token's own term (exp(b_last - b_last) = 1) cancels against
        # its "-b" side in db: both stay out (chunk_bwd_dqk.py).
        d_b = tl.sum(tl.where((o_t == last)[:, None], 0.0, b_k * x_m), axis=0) + d_last * sd
        tl.store(dblast + (slot * HV + i_h) * K + o_k, d_b, mask=m_k)

    db = -tl.sum(b_k * e_b * acc_r, axis=1)
    if i_k == 0:
        b_gkk = tl.load(gkk + p_mat, mask=lower, other=0)
        db += db_v + tl.sum(b_dl * b_gkk, axis=1)
        tl.store(dp + p_mat, tl.where(lower, b_dp * scale, 0.0), mask=m_t[:, None])
        strict = lower & (o_tt[None, :] < o_tt[:, None])
        tl.store(dg + p_mat, tl.where(strict, b_beta[:, None] * b_dl, 0.0), mask=m_t[:, None])
    tl.store(dbeta + (i_k.to(tl.int64) * ROWS + o_t) * HV + i_h, db, mask=m_t)
