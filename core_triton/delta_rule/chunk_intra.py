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
   their decays need the blocks), from chunk_gram.py's launch (``GKK_IN``,
   what the plans use), or formed here: in the backward (``STORE_BWD``) ->
   ``aqk``, ``gkk``, read back in blocks after a barrier (each program
   reads only what it wrote), in the forward each block pair as phase B
   takes it, ``P``'s -> ``aqk``, ``G``'s kept in registers.  Scalar (or
   no) gates: whole-chunk products -> ``aqk``, ``gkk``, ``G``'s read back
   the same way; the forward stores ``P`` only with ``STORE_P`` (else the
   kernel that forms the outputs forms ``P`` itself), and ``G`` only with
   ``G_WHOLE`` (else phase B forms ``G``'s blocks straight from ``k``'s);
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
    decayed_keys_t,
    diagonal_tile,
    rows_tile,
    rows_tile_t,
    unit_lower_inverse,
)


@triton.jit
def kept(blk_p, blk_g, m_i, ts, te, I: tl.constexpr, J: tl.constexpr, BC: tl.constexpr):
    """Blocks ``(I, J)`` of ``P`` and ``G`` with 0 past the chunk's end and,
    on the diagonal, above it (``P``) or from it on (``G``)."""
    o_c = tl.arange(0, BC)
    keep = m_i[:, None] & ((ts + J * BC + o_c) < te)[None, :]
    keep_p = keep
    keep_g = keep
    if I == J:
        keep_p = keep & (o_c[:, None] >= o_c[None, :])
        keep_g = keep & (o_c[:, None] > o_c[None, :])
    return tl.where(keep_p, blk_p, 0.0), tl.where(keep_g, blk_g, 0.0)


@triton.jit
def add_to_block(p0, p1, p2, p3, g0, g1, g2, g3, c_q, c_k, J: tl.constexpr):
    """The block row's accumulators with ``c_q``, ``c_k`` added to column
    block ``J``'s (Triton has no indexable tuple of tensors)."""
    if J == 0:
        p0 += c_q
        g0 += c_k
    elif J == 1:
        p1 += c_q
        g1 += c_k
    elif J == 2:
        p2 += c_q
        g2 += c_k
    else:
        p3 += c_q
        g3 += c_k
    return p0, p1, p2, p3, g0, g1, g2, g3


@triton.jit
def gram_row(
    q, k, gc, ts, te, i_h, i_hk,
    I: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BC: tl.constexpr,
    BK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Block row ``I`` of ``P`` (diagonal included) and of ``G`` (strictly
    lower) for per-channel gates: ``(p0, p1, p2, p3, g0, g1, g2, g3)``, the
    ``[BC, BC]`` float32 blocks of columns ``J`` (0 for ``J > I`` and past
    the chunk's end).  Row block ``I``'s tiles are loaded, and scaled by the
    decay from its first row, once per K tile for all its blocks ``J < I``
    (scalar gates take the whole chunk at once in the kernel)."""
    o_c = tl.arange(0, BC)
    o_i = ts + I * BC + o_c
    m_i = o_i < te
    p0 = tl.zeros([BC, BC], dtype=tl.float32)
    p1 = tl.zeros([BC, BC], dtype=tl.float32)
    p2 = tl.zeros([BC, BC], dtype=tl.float32)
    p3 = tl.zeros([BC, BC], dtype=tl.float32)
    g0 = tl.zeros([BC, BC], dtype=tl.float32)
    g1 = tl.zeros([BC, BC], dtype=tl.float32)
    g2 = tl.zeros([BC, BC], dtype=tl.float32)
    g3 = tl.zeros([BC, BC], dtype=tl.float32)
    # Block I's first row (the chunk's last when block I lies past it).
    r = tl.minimum(ts + I * BC, te - 1)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = rows_tile(q, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32)
        b_ki = rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32)
        b_bi = rows_tile(gc, o_i, m_i, HV, i_h, K, o_k, m_k)
        if I > 0:
            # Earlier blocks J: exp(b_i - b_r) * exp(b_r - b_j), both at most 1.
            b_br = tl.load(gc + (r * HV + i_h) * K + o_k, mask=m_k, other=0)
            e_i = tl.exp(tl.where(m_i[:, None], b_bi - b_br[None, :], 0.0))
            b_qe = b_q * e_i
            b_ke = b_ki * e_i
            for J in tl.static_range(3):
                if J < I:
                    o_j = ts + J * BC + o_c
                    m_j = o_j < te
                    b_kjt = decayed_keys_t(k, gc, b_br, o_j, m_j, HK, HV, i_hk, i_h, K, o_k, m_k)
                    c_q = dot(b_qe, b_kjt, PREC)
                    c_k = dot(b_ke, b_kjt, PREC)
                    p0, p1, p2, p3, g0, g1, g2, g3 = add_to_block(p0, p1, p2, p3, g0, g1, g2, g3, c_q, c_k, J)
        # The diagonal block.
        c_q = tl.zeros([BC, BC], dtype=tl.float32)
        c_k = tl.zeros([BC, BC], dtype=tl.float32)
        c_q, c_k = diagonal_tile(q, k, gc, b_q, b_ki, b_bi, c_q, c_k, ts, te, i_h, i_hk, I, o_i, m_i,
                                 HK, HV, K, BC, o_k, m_k, PREC)  # fmt: skip
        p0, p1, p2, p3, g0, g1, g2, g3 = add_to_block(p0, p1, p2, p3, g0, g1, g2, g3, c_q, c_k, I)
    p0, g0 = kept(p0, g0, m_i, ts, te, I, 0, BC)
    p1, g1 = kept(p1, g1, m_i, ts, te, I, 1, BC)
    p2, g2 = kept(p2, g2, m_i, ts, te, I, 2, BC)
    p3, g3 = kept(p3, g3, m_i, ts, te, I, 3, BC)
    return p0, p1, p2, p3, g0, g1, g2, g3


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
    k,
    gkk,
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
    float32, 0 past the chunk's end: read from ``gkk``, or (scalar or no
    gates) its own product of ``k``'s blocks."""
    if FROM_GKK:
        out = l_block(gkk, beta, ts, te, i_h, I, J, HV, BT, BC)
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
def l_row(
    q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk,
    I: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr, FROM_GKK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Block row ``I`` of ``L = diag(beta) G``: its ``[BC, BC]`` blocks of
    columns 0 to 3 (0 for ``J > I``).  Per-channel gates in the forward form
    the row here (gram_row), and store ``P``'s blocks to ``aqk``."""
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    l0 = zero
    l1 = zero
    l2 = zero
    l3 = zero
    if GATE == 2 and not FROM_GKK:
        p0, p1, p2, p3, g0, g1, g2, g3 = gram_row(q, k, gc, ts, te, i_h, i_hk, I, HK, HV, K, BC, BK, PREC)
        o_i = ts + I * BC + tl.arange(0, BC)
        b_beta = tl.load(beta + o_i * HV + i_h, mask=o_i < te, other=0).to(tl.float32)[:, None]
        store_block(aqk, p0, ts, te, i_h, I, 0, HV, BT, BC)
        l0 = g0 * b_beta
        if I >= 1:
            store_block(aqk, p1, ts, te, i_h, I, 1, HV, BT, BC)
            l1 = g1 * b_beta
        if I >= 2:
            store_block(aqk, p2, ts, te, i_h, I, 2, HV, BT, BC)
            l2 = g2 * b_beta
        if I >= 3:
            store_block(aqk, p3, ts, te, i_h, I, 3, HV, BT, BC)
            l3 = g3 * b_beta
    else:
        l0 = l_of(k, gkk, beta, gc, ts, te, i_h, i_hk, I, 0, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC)
        if I >= 1:
            l1 = l_of(k, gkk, beta, gc, ts, te, i_h, i_hk, I, 1, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC)
        if I >= 2:
            l2 = l_of(k, gkk, beta, gc, ts, te, i_h, i_hk, I, 2, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC)
        if I >= 3:
            l3 = l_of(k, gkk, beta, gc, ts, te, i_h, i_hk, I, 3, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC)
    return l0, l1, l2, l3


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
    GKK_IN: tl.constexpr = False,
    G_WHOLE: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    NC: tl.constexpr = BT // BC
    # L's blocks come back from gkk (per-channel gates, and the backward,
    # which needs G whole), or straight from K's blocks (scalar gates).
    FROM_GKK: tl.constexpr = STORE_BWD or GKK_IN or G_WHOLE
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

    # A: the decayed scores P -> aqk and Gram matrix G -> gkk.
    if GKK_IN:
        pass  # aqk and gkk come from chunk_gram.py's launch
    elif GATE == 2:
        for I in tl.static_range(NC):
            if STORE_BWD:
                p0, p1, p2, p3, g0, g1, g2, g3 = gram_row(
                    q, k, gc, ts, te, i_h, i_hk, I, HK, HV, K, BC, BK, PREC
                )
                store_block(aqk, p0, ts, te, i_h, I, 0, HV, BT, BC)
                store_block(gkk, g0, ts, te, i_h, I, 0, HV, BT, BC)
                if NC > 1:
                    store_block(aqk, p1, ts, te, i_h, I, 1, HV, BT, BC)
                    store_block(gkk, g1, ts, te, i_h, I, 1, HV, BT, BC)
                if NC > 2:
                    store_block(aqk, p2, ts, te, i_h, I, 2, HV, BT, BC)
                    store_block(gkk, g2, ts, te, i_h, I, 2, HV, BT, BC)
                    store_block(aqk, p3, ts, te, i_h, I, 3, HV, BT, BC)
                    store_block(gkk, g3, ts, te, i_h, I, 3, HV, BT, BC)
            else:
                # (the forward's blocks at or below the diagonal: l_row)
                for J in tl.static_range(I + 1, NC):
                    store_block(aqk, tl.zeros([BC, BC], dtype=tl.float32), ts, te, i_h, I, J, HV, BT, BC)
    elif STORE_BWD or STORE_P or G_WHOLE:
        # Scalar (or no) gates factor out of the sums: the whole chunk in
        # two products per K tile, then exp(b_i - b_j) on the lower triangle
        # (no 16 x 16 blocks, which per-channel gates need); the forward
        # needs P with STORE_P, and G with G_WHOLE (else phase B forms G's
        # blocks from k's).
        o_r = ts + tl.arange(0, BT)
        m_r = o_r < te
        o_rr = tl.arange(0, BT)
        acc_q = tl.zeros([BT, BT], dtype=tl.float32)
        acc_k = tl.zeros([BT, BT], dtype=tl.float32)
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_kt = rows_tile_t(k, o_r, m_r, HK, i_hk, K, o_k, m_k)
            if STORE_BWD or STORE_P:
                acc_q += dot(rows_tile(q, o_r, m_r, HK, i_hk, K, o_k, m_k), b_kt, PREC)
            if STORE_BWD or G_WHOLE:
                acc_k += dot(rows_tile(k, o_r, m_r, HK, i_hk, K, o_k, m_k), b_kt, PREC)
        valid = m_r[:, None] & m_r[None, :]
        keep_q = valid & (o_rr[:, None] >= o_rr[None, :])
        keep_k = valid & (o_rr[:, None] > o_rr[None, :])
        diff = tl.zeros([BT, BT], dtype=tl.float32)
        if GATE == 1:
            b_b = tl.load(gc + o_r * HV + i_h, mask=m_r, other=0)
            diff = b_b[:, None] - b_b[None, :]
        p_full = (o_r[:, None] * HV + i_h) * BT + o_rr[None, :]
        if STORE_BWD or STORE_P:
            tl.store(aqk + p_full, acc_q * tl.exp(tl.where(keep_q, diff, float("-inf"))), mask=m_r[:, None])
        if STORE_BWD or G_WHOLE:
            tl.store(gkk + p_full, acc_k * tl.exp(tl.where(keep_k, diff, float("-inf"))), mask=m_r[:, None])
    if FROM_GKK:
        tl.debug_barrier()

    # B: Tinv's blocks in registers (the names: block row, block column).
    l00, _, _, _ = l_row(
        q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 0, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
    )
    t00 = unit_lower_inverse(l00, BC, IEEE)
    if NC > 1:
        l10, l11, _, _ = l_row(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 1, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        t11 = unit_lower_inverse(l11, BC, IEEE)
        t10 = -dot(t11, dot(l10, t00, "ieee"), "ieee")
    if NC > 2:
        l20, l21, l22, _ = l_row(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 2, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        t22 = unit_lower_inverse(l22, BC, IEEE)
        t21 = -dot(t22, dot(l21, t11, "ieee"), "ieee")
        t20 = -dot(t22, dot(l20, t00, "ieee") + dot(l21, t10, "ieee"), "ieee")
        l30, l31, l32, l33 = l_row(
            q, k, gkk, aqk, beta, gc, ts, te, i_h, i_hk, 3, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        t33 = unit_lower_inverse(l33, BC, IEEE)
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
