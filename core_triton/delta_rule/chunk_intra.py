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


One program per (chunk slot, batch row x value head), in two phases:

A. ``P`` and ``G``: ``BC x BC`` blocks for per-channel gates (chunk_common.py:
   their decays need the blocks); in the backward (``STORE_BWD``) ->
   ``aqk``, ``gkk``, read back in blocks after a barrier (each program
   reads only what it wrote), in the forward each block pair as phase B
   takes it, ``P``'s -> ``aqk``, ``G``'s kept in registers.  Scalar (or
   no) gates: in the backward, whole-chunk products -> ``aqk``, ``gkk``,
   read back the same way; in the forward, ``G``'s blocks straight from
   ``k``'s, and ``P`` whole -> ``aqk`` (``STORE_P``; without it the output
   kernel forms ``P`` itself);
B. ``Tinv`` in ``BC x BC`` blocks held in registers (``NC = BT / BC`` up to
   4): the diagonal blocks by forward substitution (float32 inputs) or
   repeated squaring (half inputs: chunk_common.unit_lower_inverse), then
   ``Tinv[I, J] = -Tinv[I, I] sum_{J <= M < I} L[I, M] Tinv[M, J]`` with
   ``L = diag(beta) G``, in full float32 -> ``tinv``.

Its launch wants few warps (the substitution's row sums then stay inside a
warp): W, Uv and Kd, which want big products, are chunk_fwd_wu.py's.

Outputs: ``aqk``, ``gkk``, ``tinv`` ``[B*T, HV, BT]`` float32 (every
column written, zeros above the diagonal; ``aqk`` and ``gkk`` as said).
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot
from core_triton.delta_rule.chunk_common import (
    DIAG_SPLIT,
    diagonal_split,
    rows_tile,
    rows_tile_t,
    unit_lower_inverse,
)


@triton.jit
def diagonal_columns(
    q, k, gc, b_q, b_ki, b_bi, acc_q, acc_k, ts, te, i_h, i_hk,
    J: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, o_k, m_i,
):  # fmt: skip
    """``acc_q``, ``acc_k`` plus diagonal block ``J``'s ``P`` and ``G`` on
    this K tile, summed column by column (``exp(b_i - b_j)`` per channel
    formed for rows ``i >= j`` only): the blocks whose decays are too strong
    for chunk_common.diagonal_split."""
    o_c = tl.arange(0, BC)
    # Column by column: exp(b_i - b_j) per channel, rows i >= j.
    for jj in range(0, BC):
        row_j = ts + J * BC + jj
        m_kj = o_k < tl.where(row_j < te, K, 0)  # (a vector test: the interpreter refuses a scalar in a mask)
        b_kj = tl.load(k + (row_j * HK + i_hk) * K + o_k, mask=m_kj, other=0).to(tl.float32)
        b_bj = tl.load(gc + (row_j * HV + i_h) * K + o_k, mask=m_kj, other=0)
        seen = (o_c >= jj) & m_i
        e = tl.exp(tl.where(seen[:, None], b_bi - b_bj[None, :], float("-inf")))
        col = o_c[None, :] == jj
        acc_q += tl.where(col, tl.sum(b_q * b_kj[None, :] * e, axis=1)[:, None], 0.0)
        acc_k += tl.where(col, tl.sum(b_ki * b_kj[None, :] * e, axis=1)[:, None], 0.0)
    return acc_q, acc_k


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
            fits, b_m, e_i, _ = diagonal_split(gc, b_bi, m_i, ts, te, I, i_h, HV, K, BC, o_k, m_k)
            if fits:
                # f transposed, from transposed loads (no tl.trans in registers).
                b_bt = rows_tile_t(gc, o_i, m_i, HV, i_h, K, o_k, m_k)
                f_t = tl.exp(tl.minimum(tl.where(m_i[None, :], b_m[:, None] - b_bt, 0.0), DIAG_SPLIT))
                b_kjt = rows_tile_t(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * f_t
                acc_q += dot(b_q * e_i, b_kjt, PREC)
                acc_k += dot(b_ki * e_i, b_kjt, PREC)
            else:
                acc_q, acc_k = diagonal_columns(q, k, gc, b_q, b_ki, b_bi, acc_q, acc_k, ts, te, i_h, i_hk,
                                                J, HK, HV, K, BC, o_k, m_i)  # fmt: skip
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


@triton.jit
def l_block(
    gkk,
    beta,
    ts,
    te,
    i_h,
    I: tl.constexpr,
    J: tl.constexpr,
    HV: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    """Block ``(I, J)`` of ``L = diag(beta) G``, ``[BC, BC]`` float32, from
    ``gkk`` (0 past the chunk's end)."""
    o_c = tl.arange(0, BC)
    o_i = ts + I * BC + o_c
    m_i = o_i < te
    b_beta = tl.load(beta + o_i * HV + i_h, mask=m_i, other=0).to(tl.float32)
    b_g = tl.load(gkk + (o_i[:, None] * HV + i_h) * BT + J * BC + o_c[None, :], mask=m_i[:, None], other=0)
    return b_g * b_beta[:, None]


@triton.jit
def l_of(
    q,
    k,
    gkk,
    aqk,
    beta,
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
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    GATE: tl.constexpr,
    FROM_GKK: tl.constexpr,
    PREC: tl.constexpr,
):
    """Block ``(I, J)`` (``J <= I``) of ``L = diag(beta) G``, ``[BC, BC]``
    float32, 0 past the chunk's end: read from ``gkk``; or (per-channel
    gates, forward) formed here with ``P``'s block, which goes to ``aqk``;
    or (scalar or no gates) its own product of ``k``'s blocks."""
    if FROM_GKK:
        out = l_block(gkk, beta, ts, te, i_h, I, J, HV, BT, BC)
    elif GATE == 2:
        blk_q, blk_k = gram_block(q, k, gc, ts, te, i_h, i_hk, I, J, HK, HV, K, BC, BK, PREC)
        store_block(aqk, blk_q, ts, te, i_h, I, J, HV, BT, BC)
        o_i = ts + I * BC + tl.arange(0, BC)
        b_beta = tl.load(beta + o_i * HV + i_h, mask=o_i < te, other=0).to(tl.float32)
        out = blk_k * b_beta[:, None]
    else:
        o_c = tl.arange(0, BC)
        o_i = ts + I * BC + o_c
        o_j = ts + J * BC + o_c
        m_i = o_i < te
        m_j = o_j < te
        acc = tl.zeros([BC, BC], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_ki = rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k)
            acc += dot(b_ki, rows_tile_t(k, o_j, m_j, HK, i_hk, K, o_k, m_k), PREC)
        keep = m_i[:, None] & m_j[None, :]
        if I == J:
            keep = keep & (o_c[:, None] > o_c[None, :])
        diff = tl.zeros([BC, BC], dtype=tl.float32)
        if GATE == 1:
            diff = (
                tl.load(gc + o_i * HV + i_h, mask=m_i, other=0)[:, None]
                - tl.load(gc + o_j * HV + i_h, mask=m_j, other=0)[None, :]
            )
        b_beta = tl.load(beta + o_i * HV + i_h, mask=m_i, other=0).to(tl.float32)
        out = acc * tl.exp(tl.where(keep, diff, float("-inf"))) * b_beta[:, None]
    return out


@triton.jit
def store_block(
    p,
    blk,
    ts,
    te,
    i_h,
    I: tl.constexpr,
    J: tl.constexpr,
    HV: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
):
    """Store block ``(I, J)`` of a per-chunk ``[B*T, HV, BT]`` matrix."""
    o_c = tl.arange(0, BC)
    o_i = ts + I * BC + o_c
    tl.store(p + (o_i[:, None] * HV + i_h) * BT + J * BC + o_c[None, :], blk, mask=(o_i < te)[:, None])


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_intra_kernel(
    q,
    k,
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
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    GATE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STORE_BWD: tl.constexpr,
    STORE_P: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    NC: tl.constexpr = BT // BC
    # L's blocks come back from gkk (per-channel gates, and the backward,
    # which needs G whole), or straight from K's blocks (scalar gates).
    FROM_GKK: tl.constexpr = STORE_BWD
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

    # A: the decayed scores P -> aqk and Gram matrix G -> gkk.
    if GATE == 2:
        for I in tl.static_range(NC):
            o_i = ts + I * BC + o_c
            m_i = o_i < te
            for J in tl.static_range(NC):
                p_blk = (o_i[:, None] * HV + i_h) * BT + J * BC + o_c[None, :]
                if J <= I:
                    if STORE_BWD:
                        blk_q, blk_k = gram_block(q, k, gc, ts, te, i_h, i_hk, I, J, HK, HV, K, BC, BK, PREC)
                        tl.store(aqk + p_blk, blk_q, mask=m_i[:, None])
                        tl.store(gkk + p_blk, blk_k, mask=m_i[:, None])
                else:
                    # (the forward's blocks at or below the diagonal: l_of)
                    zero = tl.zeros([BC, BC], dtype=tl.float32)
                    tl.store(aqk + p_blk, zero, mask=m_i[:, None])
                    if STORE_BWD:
                        tl.store(gkk + p_blk, zero, mask=m_i[:, None])
    elif STORE_BWD or STORE_P:
        # Scalar (or no) gates factor out of the sums: the whole chunk in
        # two products per K tile, then exp(b_i - b_j) on the lower triangle
        # (no 16 x 16 blocks, which per-channel gates need); the forward
        # (STORE_P) needs only P.
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
            if STORE_BWD:
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
        if STORE_BWD:
            tl.store(gkk + p_full, acc_k * tl.exp(tl.where(keep_k, diff, float("-inf"))), mask=m_r[:, None])
    if FROM_GKK:
        tl.debug_barrier()

    # B: Tinv's blocks in registers (the names: block row, block column).
    t00 = unit_lower_inverse(
        l_of(q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 0, 0, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC),
        BC,
        IEEE,
    )
    if NC > 1:
        l10 = l_of(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 1, 0, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        t11 = unit_lower_inverse(
            l_of(
                q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 1, 1, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
            ),
            BC,
            IEEE,
        )
        t10 = -dot(t11, dot(l10, t00, "ieee"), "ieee")
    if NC > 2:
        l20 = l_of(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 2, 0, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        l21 = l_of(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 2, 1, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        t22 = unit_lower_inverse(
            l_of(
                q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 2, 2, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
            ),
            BC,
            IEEE,
        )
        t21 = -dot(t22, dot(l21, t11, "ieee"), "ieee")
        t20 = -dot(t22, dot(l20, t00, "ieee") + dot(l21, t10, "ieee"), "ieee")
        l30 = l_of(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 3, 0, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        l31 = l_of(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 3, 1, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        l32 = l_of(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 3, 2, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        t33 = unit_lower_inverse(
            l_of(
                q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 3, 3, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
            ),
            BC,
            IEEE,
        )
        t32 = -dot(t33, dot(l32, t22, "ieee"), "ieee")
        t31 = -dot(t33, dot(l31, t11, "ieee") + dot(l32, t21, "ieee"), "ieee")
        t30 = -dot(t33, dot(l30, t00, "ieee") + dot(l31, t10, "ieee") + dot(l32, t20, "ieee"), "ieee")
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    store_block(tinv, t00, ts, te, i_h, 0, 0, HV, BT, BC)
    for J in tl.static_range(1, NC):
        store_block(tinv, zero, ts, te, i_h, 0, J, HV, BT, BC)
    if NC > 1:
        store_block(tinv, t10, ts, te, i_h, 1, 0, HV, BT, BC)
        store_block(tinv, t11, ts, te, i_h, 1, 1, HV, BT, BC)
        for J in tl.static_range(2, NC):
            store_block(tinv, zero, ts, te, i_h, 1, J, HV, BT, BC)
    if NC > 2:
        store_block(tinv, t20, ts, te, i_h, 2, 0, HV, BT, BC)
        store_block(tinv, t21, ts, te, i_h, 2, 1, HV, BT, BC)
        store_block(tinv, t22, ts, te, i_h, 2, 2, HV, BT, BC)
        store_block(tinv, zero, ts, te, i_h, 2, 3, HV, BT, BC)
        store_block(tinv, t30, ts, te, i_h, 3, 0, HV, BT, BC)
        store_block(tinv, t31, ts, te, i_h, 3, 1, HV, BT, BC)
        store_block(tinv, t32, ts, te, i_h, 3, 2, HV, BT, BC)
        store_block(tinv, t33, ts, te, i_h, 3, 3, HV, BT, BC)
