"""Per-chunk quantities of the chunk-parallel gated delta rule.

Inside a chunk, with ``b`` the in-chunk cumulative log decay and ``E[i, j]
= exp(b_i - b_j)`` (per key channel for ``gk``), let

    P[i, j] = sum_k q_i E[i, j] k_j        (j <= i)   the decayed scores
    G[i, j] = sum_k k_i E[i, j] k_j        (j <  i)   the decayed key Gram matrix
    Tinv    = (I + diag(beta) G)^-1                    unit lower triangular
    W       = Tinv diag(beta) (k * exp(b))             [BT, K]
    Uv      = Tinv diag(beta) v                        [BT, V]
    Kd      = k * exp(b_last - b)                      [BT, K]

(``b_last``: the chunk's last token) so that the chunk's delta updates,
from the state ``S`` entering it, are ``U = Uv - W S`` and the state
leaving it ``exp(b_last) S + Kd^T U`` (the WY / UT form of the product of
the chunk's Householder-like factors; chunk_fwd_state.py carries ``S``).


One program per (chunk slot, batch row x value head), in three phases that
hand over through global memory (each program reads back only what it
wrote, after a barrier):

A. ``P`` and ``G``: whole-chunk products for scalar (or no) gates, ``BC x
   BC`` blocks for per-channel ones (chunk_common.py: their decays need the
   blocks) -> ``aqk``, ``gkk``;
B. ``Tinv`` block by block: the diagonal blocks by forward substitution,
   then ``Tinv[I, J] = -Tinv[I, I] sum_{J <= M < I} L[I, M] Tinv[M, J]``
   with ``L = diag(beta) G``, in full float32 -> ``tinv``;
C. ``W`` and ``Uv`` from the whole ``[BT, BT]`` inverse, and ``Kd``.

Outputs: ``aqk``, ``gkk``, ``tinv`` ``[B*T, HV, BT]`` float32 (every
column written, zeros above the diagonal), ``w``, ``kd`` ``[B*T, HV, K]``
and ``uv [B*T, HV, V]`` (float32, or the inputs' dtype for half inputs:
chunk.py; computed in float32 and rounded once).
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot
from core_triton.delta_rule.chunk_common import rows_tile, rows_tile_t, unit_lower_inverse


@triton.jit
def gram_block(
    q,
    k,
    gc,
    ts,
    te,
    i_h,
    i_hk,
    I: tl.constexpr,
    J: tl.constexpr,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    PREC: tl.constexpr,
):
    """Block ``(I, J)`` (``J <= I``) of ``P`` (diagonal included) and of
    ``G`` (strictly lower), ``[BC, BC]`` float32 each, for per-channel
    gates (scalar gates take the whole chunk at once in the kernel)."""
    o_c = tl.arange(0, BC)
    o_i = ts + I * BC + o_c
    o_j = ts + J * BC + o_c
    m_i = o_i < te
    m_j = o_j < te
    valid = m_i[:, None] & m_j[None, :]
    if I == J:
        keep_q = valid & (o_c[:, None] >= o_c[None, :])
        keep_k = valid & (o_c[:, None] > o_c[None, :])
    else:
        keep_q = valid
        keep_k = valid
    acc_q = tl.zeros([BC, BC], dtype=tl.float32)
    acc_k = tl.zeros([BC, BC], dtype=tl.float32)
    # Block I's first row (the chunk's last when block I lies past it).
    r = tl.minimum(ts + I * BC, te - 1)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = rows_tile(q, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32)
        b_ki = rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32)
        b_bi = rows_tile(gc, o_i, m_i, HV, i_h, K, o_k, m_k)
        if I == J:
            # Column by column: exp(b_i - b_j) per channel, rows i >= j.
            for jj in range(0, BC):
                row_j = ts + J * BC + jj
                m_kj = o_k < tl.where(
                    row_j < te, K, 0
                )  # (a vector test: the interpreter refuses a scalar in a mask)
                b_kj = tl.load(k + (row_j * HK + i_hk) * K + o_k, mask=m_kj, other=0).to(tl.float32)
                b_bj = tl.load(gc + (row_j * HV + i_h) * K + o_k, mask=m_kj, other=0)
                seen = (o_c >= jj) & m_i
                e = tl.exp(tl.where(seen[:, None], b_bi - b_bj[None, :], float("-inf")))
                col = o_c[None, :] == jj
                acc_q += tl.where(col, tl.sum(b_q * b_kj[None, :] * e, axis=1)[:, None], 0.0)
                acc_k += tl.where(col, tl.sum(b_ki * b_kj[None, :] * e, axis=1)[:, None], 0.0)
        else:
            b_br = tl.load(gc + (r * HV + i_h) * K + o_k, mask=m_k, other=0)
            e_i = tl.exp(tl.where(m_i[:, None], b_bi - b_br[None, :], 0.0))
            b_kjt = rows_tile_t(k, o_j, m_j, HK, i_hk, K, o_k, m_k).to(tl.float32)
            b_bjt = rows_tile_t(gc, o_j, m_j, HV, i_h, K, o_k, m_k)
            b_kjt = b_kjt * tl.exp(tl.where(m_j[None, :], b_br[:, None] - b_bjt, 0.0))
            acc_q += dot(b_q * e_i, b_kjt, PREC)
            acc_k += dot(b_ki * e_i, b_kjt, PREC)
    acc_q = tl.where(keep_q, acc_q, 0.0)
    acc_k = tl.where(keep_k, acc_k, 0.0)
    return acc_q, acc_k


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_intra_kernel(
    q,
    k,
    v,
    beta,
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
    tinv,
    w,
    uv,
    kd,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    NC: tl.constexpr = BT // BC
    i_s = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // HV
    i_h = i_bh % HV
    i_hk = i_h // (HV // HK)
    _, _, _, ts, te, _ = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input
    o_c = tl.arange(0, BC)

    # A: the decayed score and Gram blocks.
    if GATE == 2:
        for I in tl.static_range(NC):
            o_i = ts + I * BC + o_c
            m_i = o_i < te
            for J in tl.static_range(NC):
                p_blk = (o_i[:, None] * HV + i_h) * BT + J * BC + o_c[None, :]
                if J <= I:
                    blk_q, blk_k = gram_block(q, k, gc, ts, te, i_h, i_hk, I, J, HK, HV, K, BC, BK, PREC)
                else:
                    blk_q = tl.zeros([BC, BC], dtype=tl.float32)
                    blk_k = tl.zeros([BC, BC], dtype=tl.float32)
                tl.store(aqk + p_blk, blk_q, mask=m_i[:, None])
                tl.store(gkk + p_blk, blk_k, mask=m_i[:, None])
    else:
        # Scalar (or no) gates factor out of the sums: the whole chunk in
        # two products per K tile, then exp(b_i - b_j) on the lower triangle
        # (no 16 x 16 blocks, which per-channel gates need).
        o_r = ts + tl.arange(0, BT)
        m_r = o_r < te
        o_rr = tl.arange(0, BT)
        acc_q = tl.zeros([BT, BT], dtype=tl.float32)
        acc_k = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_kt = rows_tile_t(k, o_r, m_r, HK, i_hk, K, o_k, m_k)
            acc_q += dot(rows_tile(q, o_r, m_r, HK, i_hk, K, o_k, m_k), b_kt, PREC)
            acc_k += dot(rows_tile(k, o_r, m_r, HK, i_hk, K, o_k, m_k), b_kt, PREC)
        valid = m_r[:, None] & m_r[None, :]
        keep_q = valid & (o_rr[:, None] >= o_rr[None, :])
        keep_k = valid & (o_rr[:, None] > o_rr[None, :])
        diff = tl.zeros([BT, BT], dtype=tl.float32)
        if GATE == 1:
            b_b = tl.load(gc + o_r * HV + i_h, mask=m_r, other=0)
            diff = b_b[:, None] - b_b[None, :]
        p_full = (o_r[:, None] * HV + i_h) * BT + o_rr[None, :]
        tl.store(aqk + p_full, acc_q * tl.exp(tl.where(keep_q, diff, float("-inf"))), mask=m_r[:, None])
        tl.store(gkk + p_full, acc_k * tl.exp(tl.where(keep_k, diff, float("-inf"))), mask=m_r[:, None])
    tl.debug_barrier()

    # B: Tinv = (I + diag(beta) G)^-1, block row by block row.
    for I in tl.static_range(NC):
        o_i = ts + I * BC + o_c
        m_i = o_i < te
        b_beta = tl.load(beta + o_i * HV + i_h, mask=m_i, other=0).to(tl.float32)
        p_row = (o_i[:, None] * HV + i_h) * BT + o_c[None, :]
        L_ii = b_beta[:, None] * tl.load(gkk + p_row + I * BC, mask=m_i[:, None], other=0)
        T_ii = unit_lower_inverse(L_ii, BC)
        tl.store(tinv + p_row + I * BC, T_ii, mask=m_i[:, None])
        for J in tl.static_range(NC):
            if J < I:
                acc = tl.zeros([BC, BC], dtype=tl.float32)
                for M in tl.static_range(NC):
                    if M >= J:
                        if M < I:
                            o_m = ts + M * BC + o_c
                            L_im = b_beta[:, None] * tl.load(gkk + p_row + M * BC, mask=m_i[:, None], other=0)
                            p_mj = (o_m[:, None] * HV + i_h) * BT + J * BC + o_c[None, :]
                            T_mj = tl.load(tinv + p_mj, mask=(o_m < te)[:, None], other=0)
                            acc += dot(L_im, T_mj, "ieee")
                tl.store(tinv + p_row + J * BC, -dot(T_ii, acc, "ieee"), mask=m_i[:, None])
            if J > I:
                tl.store(tinv + p_row + J * BC, tl.zeros([BC, BC], dtype=tl.float32), mask=m_i[:, None])
        tl.debug_barrier()

    # C: W and Uv from the whole inverse.
    o_t = ts + tl.arange(0, BT)
    m_t = o_t < te
    o_tt = tl.arange(0, BT)
    b_tinv = tl.load(
        tinv + (o_t[:, None] * HV + i_h) * BT + o_tt[None, :],
        mask=m_t[:, None] & (o_tt[None, :] <= o_tt[:, None]),
        other=0,
    )
    b_beta = tl.load(beta + o_t * HV + i_h, mask=m_t, other=0).to(tl.float32)
    last = te - 1
    decay = tl.where(m_t, 1.0, 0.0)  # exp(b) per row (scalar gates)
    decay_last = tl.where(m_t, 1.0, 0.0)  # exp(b_last - b) per row
    if GATE == 1:
        b_g = tl.load(gc + o_t * HV + i_h, mask=m_t, other=0)
        decay = tl.exp(b_g)
        decay_last = tl.exp(tl.where(m_t, tl.load(gc + last * HV + i_h) - b_g, float("-inf")))
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_k = rows_tile(k, o_t, m_t, HK, i_hk, K, o_k, m_k).to(tl.float32)
        if GATE == 2:
            b_gk = rows_tile(gc, o_t, m_t, HV, i_h, K, o_k, m_k)
            g_last = tl.load(gc + (last * HV + i_h) * K + o_k, mask=m_k, other=0)
            b_kb = b_k * tl.exp(b_gk) * b_beta[:, None]
            b_kd = b_k * tl.exp(tl.where(m_t[:, None], g_last[None, :] - b_gk, float("-inf")))
        else:
            b_kb = b_k * (decay * b_beta)[:, None]
            b_kd = b_k * decay_last[:, None]
        p_w = (o_t[:, None] * HV + i_h) * K + o_k[None, :]
        tl.store(w + p_w, dot(b_tinv, b_kb, PREC), mask=m_t[:, None] & m_k[None, :])
        tl.store(kd + p_w, b_kd, mask=m_t[:, None] & m_k[None, :])
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_v = rows_tile(v, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32) * b_beta[:, None]
        p_u = (o_t[:, None] * HV + i_h) * V + o_v[None, :]
        tl.store(uv + p_u, dot(b_tinv, b_v, PREC), mask=m_t[:, None] & m_v[None, :])
