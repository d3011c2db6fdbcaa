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

A. ``P`` and ``G``.  Per-channel gates: ``BC x BC`` blocks (chunk_common.py:
   their decays need the blocks), the diagonal ones from chunk_diag.py's
   launch (``pdiag``, ``gdiag``), those below it formed here in one pass
   over K (off_diagonal_blocks) and kept in registers; ``P`` -> ``aqk``,
   and ``G`` -> ``gkk`` in the backward (``STORE_BWD``).  Scalar (or no)
   gates: whole-chunk products -> ``aqk``, ``gkk``, ``G``'s read back in
   blocks after a barrier (each program reads only what it wrote); the
   forward stores ``P`` only with ``STORE_P`` (else the kernel that forms
   the outputs forms ``P`` itself), and ``G`` only with ``G_WHOLE`` (else
   phase B forms ``G``'s blocks straight from ``k``'s);
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
from core_triton.delta_rule.chunk_common import (
    decayed_keys_t,
    rows_tile,
    rows_tile_t,
    slot_chunk,
    unit_lower_inverse,
)


@triton.jit
def load_block(p, ts, te, i_h, I: tl.constexpr, J: tl.constexpr, HV: tl.constexpr, W: tl.constexpr,
               BC: tl.constexpr):  # fmt: skip
    """Block ``(I, J)`` of a per-chunk ``[B*T, HV, W]`` matrix (store_block's
    reverse), 0 past the chunk's end."""
    o_c = tl.arange(0, BC)
    o_i = ts + I * BC + o_c
    return tl.load(
        p + (o_i[:, None] * HV + i_h) * W + J * BC + o_c[None, :], mask=(o_i < te)[:, None], other=0
    )


@triton.jit
def row_beta(beta, ts, te, i_h, I: tl.constexpr, HV: tl.constexpr, BC: tl.constexpr):
    """``beta`` of block ``I``'s rows, ``[BC, 1]`` float32."""
    o_i = ts + I * BC + tl.arange(0, BC)
    return tl.load(beta + o_i * HV + i_h, mask=o_i < te, other=0).to(tl.float32)[:, None]


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
    return load_block(gkk, ts, te, i_h, I, J, HV, BT, BC) * row_beta(beta, ts, te, i_h, I, HV, BC)


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
        out = acc * tl.exp(tl.where(keep, diff, float("-inf"))) * row_beta(beta, ts, te, i_h, I, HV, BC)
    return out


@triton.jit
def l_row(
    k, gkk, beta, gc, ts, te, i_h, i_hk,
    I: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
    BC: tl.constexpr, BK: tl.constexpr, GATE: tl.constexpr, FROM_GKK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Block row ``I`` of ``L = diag(beta) G`` (scalar or no gates): its
    ``[BC, BC]`` blocks of columns 0 to 3 (0 for ``J > I``)."""
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    l1 = zero
    l2 = zero
    l3 = zero
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


@triton.jit
def store_row(p, x0, x1, x2, x3, ts, te, i_h, I: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr,
              BC: tl.constexpr):  # fmt: skip
    """Store block row ``I`` of a per-chunk matrix: its blocks ``x0`` ...
    of columns ``J < BT / BC``."""
    NC: tl.constexpr = BT // BC
    store_block(p, x0, ts, te, i_h, I, 0, HV, BT, BC)
    if NC > 1:
        store_block(p, x1, ts, te, i_h, I, 1, HV, BT, BC)
    if NC > 2:
        store_block(p, x2, ts, te, i_h, I, 2, HV, BT, BC)
        store_block(p, x3, ts, te, i_h, I, 3, HV, BT, BC)


@triton.jit
def inverse_row1(l10, l11, t00, BC: tl.constexpr, EXACT: tl.constexpr):
    """Block row 1 of ``Tinv = (I + L)^-1`` from ``L``'s and row 0's."""
    t11 = unit_lower_inverse(l11, BC, EXACT)
    return -dot(t11, dot(l10, t00, "ieee"), "ieee"), t11


@triton.jit
def inverse_row2(l20, l21, l22, t00, t10, t11, BC: tl.constexpr, EXACT: tl.constexpr):
    """Block row 2 of ``Tinv``: ``Tinv[I, J] = -Tinv[I, I] sum_{J <= M <
    I} L[I, M] Tinv[M, J]``."""
    t22 = unit_lower_inverse(l22, BC, EXACT)
    t21 = -dot(t22, dot(l21, t11, "ieee"), "ieee")
    t20 = -dot(t22, dot(l20, t00, "ieee") + dot(l21, t10, "ieee"), "ieee")
    return t20, t21, t22


@triton.jit
def inverse_row3(l30, l31, l32, l33, t00, t10, t11, t20, t21, t22, BC: tl.constexpr, EXACT: tl.constexpr):
    """Block row 3 of ``Tinv``."""
    t33 = unit_lower_inverse(l33, BC, EXACT)
    t32 = -dot(t33, dot(l32, t22, "ieee"), "ieee")
    t31 = -dot(t33, dot(l31, t11, "ieee") + dot(l32, t21, "ieee"), "ieee")
    t30 = -dot(t33, dot(l30, t00, "ieee") + dot(l31, t10, "ieee") + dot(l32, t20, "ieee"), "ieee")
    return t30, t31, t32, t33


@triton.jit
def scaled_rows(q, k, gc, ts, te, i_h, i_hk, I: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, BC: tl.constexpr, o_k, m_k):  # fmt: skip
    """Block ``I``'s rows of ``q`` and ``k`` on this K tile decayed to its
    first row ``r``, ``x_i * exp(b_i - b_r)`` ``[BC, BK]`` float32 (at most
    ``|x_i|``; 0 past the chunk's end), and ``b_r`` ``[BK]``."""
    o_i = ts + I * BC + tl.arange(0, BC)
    m_i = o_i < te
    r = tl.minimum(ts + I * BC, te - 1)  # (the chunk's last row for a block past it)
    b_br = tl.load(gc + (r * HV + i_h) * K + o_k, mask=m_k, other=0)
    e_i = tl.exp(tl.where(m_i[:, None], rows_tile(gc, o_i, m_i, HV, i_h, K, o_k, m_k) - b_br[None, :], 0.0))
    b_q = rows_tile(q, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * e_i
    b_k = rows_tile(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * e_i
    return b_q, b_k, b_br


@triton.jit
def add_pair(acc_p, acc_g, b_qe, b_ke, b_br, k, gc, ts, te, i_h, i_hk, J: tl.constexpr, HK: tl.constexpr,
             HV: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, o_k, m_k,
             PREC: tl.constexpr):  # fmt: skip
    """``acc_p``, ``acc_g`` plus this K tile's part of blocks ``(I, J)``,
    ``J < I``, of ``P`` and ``G``, from block ``I``'s scaled rows
    (scaled_rows) and block ``J``'s keys decayed to the same row ``r``:
    ``exp(b_i - b_r) * exp(b_r - b_j)``, both at most 1."""
    o_j = ts + J * BC + tl.arange(0, BC)
    b_kjt = decayed_keys_t(k, gc, b_br, o_j, o_j < te, HK, HV, i_hk, i_h, K, o_k, m_k)
    return acc_p + dot(b_qe, b_kjt, PREC), acc_g + dot(b_ke, b_kjt, PREC)


@triton.jit
def off_diagonal_blocks(q, k, gc, ts, te, i_h, i_hk, HK: tl.constexpr, HV: tl.constexpr,
                        K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                        PREC: tl.constexpr):  # fmt: skip
    """The blocks below the diagonal of ``P`` and ``G`` for per-channel
    gates, ``(p10, p20, p21, p30, p31, p32, g10, ..., g32)`` ``[BC, BC]``
    float32 (0 past the chunk's end; 0 where ``BT / BC`` has no such
    block): one pass over K, each block row's tiles loaded and scaled once
    per K tile for all its blocks, block ``J``'s loaded transposed for each
    pair (H100, KDA B4 T4k HV32 K=V=128 bf16: 0.59 ms, where loading each
    block once per K tile and transposing its decayed keys in registers
    took 0.72)."""
    NC: tl.constexpr = BT // BC
    p10 = tl.zeros([BC, BC], dtype=tl.float32)
    p20 = p10
    p21 = p10
    p30 = p10
    p31 = p10
    p32 = p10
    g10 = p10
    g20 = p10
    g21 = p10
    g30 = p10
    g31 = p10
    g32 = p10
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        if NC > 1:
            b_qe, b_ke, b_br = scaled_rows(q, k, gc, ts, te, i_h, i_hk, 1, HK, HV, K, BC, o_k, m_k)
            p10, g10 = add_pair(
                p10, g10, b_qe, b_ke, b_br, k, gc, ts, te, i_h, i_hk, 0, HK, HV, K, BC, o_k, m_k, PREC
            )
        if NC > 2:
            b_qe, b_ke, b_br = scaled_rows(q, k, gc, ts, te, i_h, i_hk, 2, HK, HV, K, BC, o_k, m_k)
            p20, g20 = add_pair(
                p20, g20, b_qe, b_ke, b_br, k, gc, ts, te, i_h, i_hk, 0, HK, HV, K, BC, o_k, m_k, PREC
            )
            p21, g21 = add_pair(
                p21, g21, b_qe, b_ke, b_br, k, gc, ts, te, i_h, i_hk, 1, HK, HV, K, BC, o_k, m_k, PREC
            )
            b_qe, b_ke, b_br = scaled_rows(q, k, gc, ts, te, i_h, i_hk, 3, HK, HV, K, BC, o_k, m_k)
            p30, g30 = add_pair(
                p30, g30, b_qe, b_ke, b_br, k, gc, ts, te, i_h, i_hk, 0, HK, HV, K, BC, o_k, m_k, PREC
            )
            p31, g31 = add_pair(
                p31, g31, b_qe, b_ke, b_br, k, gc, ts, te, i_h, i_hk, 1, HK, HV, K, BC, o_k, m_k, PREC
            )
            p32, g32 = add_pair(
                p32, g32, b_qe, b_ke, b_br, k, gc, ts, te, i_h, i_hk, 2, HK, HV, K, BC, o_k, m_k, PREC
            )
    return p10, p20, p21, p30, p31, p32, g10, g20, g21, g30, g31, g32


@triton.jit
def diag_block(x, ts, te, i_h, I: tl.constexpr, HV: tl.constexpr, BC: tl.constexpr):
    """Block ``(I, I)`` from chunk_diag.py's ``[B*T, HV, BC]`` output (0
    past the chunk's end)."""
    return load_block(x, ts, te, i_h, I, 0, HV, BC, BC)


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_intra_kernel(
    q,
    k,
    beta,
    gc,
    pdiag,
    gdiag,
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
    G_WHOLE: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    NC: tl.constexpr = BT // BC
    i_s, i_bh = tl.program_id(0), tl.program_id(1)
    i_h, i_hk, ts, te, _ = slot_chunk(
        cu_seqlens, chunk_offsets, i_s, i_bh, T, N, n_iter, NT, NS, HK, HV, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input

    zero = tl.zeros([BC, BC], dtype=tl.float32)
    t10 = zero
    t11 = zero
    t20 = zero
    t21 = zero
    t22 = zero
    t30 = zero
    t31 = zero
    t32 = zero
    t33 = zero
    if GATE == 2:
        # Per-channel gates: the diagonal blocks of P and G from chunk_diag.py,
        # those below it formed here; P -> aqk (and G -> gkk for the backward),
        # L = diag(beta) G kept in registers for the inverse.
        p10, p20, p21, p30, p31, p32, g10, g20, g21, g30, g31, g32 = off_diagonal_blocks(
            q, k, gc, ts, te, i_h, i_hk, HK, HV, K, BT, BC, BK, PREC
        )
        store_row(
            aqk, diag_block(pdiag, ts, te, i_h, 0, HV, BC), zero, zero, zero, ts, te, i_h, 0, HV, BT, BC
        )
        d0 = diag_block(gdiag, ts, te, i_h, 0, HV, BC)
        if STORE_BWD:
            store_row(gkk, d0, zero, zero, zero, ts, te, i_h, 0, HV, BT, BC)
        t00 = unit_lower_inverse(d0 * row_beta(beta, ts, te, i_h, 0, HV, BC), BC, IEEE)
        if NC > 1:
            p11 = diag_block(pdiag, ts, te, i_h, 1, HV, BC)
            store_row(aqk, p10, p11, zero, zero, ts, te, i_h, 1, HV, BT, BC)
            d1 = diag_block(gdiag, ts, te, i_h, 1, HV, BC)
            if STORE_BWD:
                store_row(gkk, g10, d1, zero, zero, ts, te, i_h, 1, HV, BT, BC)
            b1 = row_beta(beta, ts, te, i_h, 1, HV, BC)
            t10, t11 = inverse_row1(g10 * b1, d1 * b1, t00, BC, IEEE)
        if NC > 2:
            p22 = diag_block(pdiag, ts, te, i_h, 2, HV, BC)
            store_row(aqk, p20, p21, p22, zero, ts, te, i_h, 2, HV, BT, BC)
            d2 = diag_block(gdiag, ts, te, i_h, 2, HV, BC)
            if STORE_BWD:
                store_row(gkk, g20, g21, d2, zero, ts, te, i_h, 2, HV, BT, BC)
            b2 = row_beta(beta, ts, te, i_h, 2, HV, BC)
            t20, t21, t22 = inverse_row2(g20 * b2, g21 * b2, d2 * b2, t00, t10, t11, BC, IEEE)
            p33 = diag_block(pdiag, ts, te, i_h, 3, HV, BC)
            store_row(aqk, p30, p31, p32, p33, ts, te, i_h, 3, HV, BT, BC)
            d3 = diag_block(gdiag, ts, te, i_h, 3, HV, BC)
            if STORE_BWD:
                store_row(gkk, g30, g31, g32, d3, ts, te, i_h, 3, HV, BT, BC)
            b3 = row_beta(beta, ts, te, i_h, 3, HV, BC)
            t30, t31, t32, t33 = inverse_row3(
                g30 * b3, g31 * b3, g32 * b3, d3 * b3, t00, t10, t11, t20, t21, t22, BC, IEEE
            )
    else:
        # A: scalar (or no) gates factor out of the sums: P and G of the whole
        # chunk in two products per K tile, then exp(b_i - b_j) on the lower
        # triangle (no 16 x 16 blocks, which per-channel gates need); the
        # forward needs P with STORE_P, and G with G_WHOLE (else phase B forms
        # G's blocks from k's).
        FROM_GKK: tl.constexpr = STORE_BWD or G_WHOLE
        if STORE_BWD or STORE_P or G_WHOLE:
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
                tl.store(
                    aqk + p_full, acc_q * tl.exp(tl.where(keep_q, diff, float("-inf"))), mask=m_r[:, None]
                )
            if STORE_BWD or G_WHOLE:
                tl.store(
                    gkk + p_full, acc_k * tl.exp(tl.where(keep_k, diff, float("-inf"))), mask=m_r[:, None]
                )
        if FROM_GKK:
            tl.debug_barrier()  # (each program reads back only the rows it wrote)

        # B: Tinv's blocks in registers (the names: block row, block column).
        l00, _, _, _ = l_row(
            k, gkk, beta, gc, ts, te, i_h, i_hk, 0, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
        )
        t00 = unit_lower_inverse(l00, BC, IEEE)
        if NC > 1:
            l10, l11, _, _ = l_row(
                k, gkk, beta, gc, ts, te, i_h, i_hk, 1, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
            )
            t10, t11 = inverse_row1(l10, l11, t00, BC, IEEE)
        if NC > 2:
            l20, l21, l22, _ = l_row(
                k, gkk, beta, gc, ts, te, i_h, i_hk, 2, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
            )
            t20, t21, t22 = inverse_row2(l20, l21, l22, t00, t10, t11, BC, IEEE)
            l30, l31, l32, l33 = l_row(
                k, gkk, beta, gc, ts, te, i_h, i_hk, 3, HK, HV, K, BT, BC, BK, GATE, FROM_GKK, PREC
            )
            t30, t31, t32, t33 = inverse_row3(l30, l31, l32, l33, t00, t10, t11, t20, t21, t22, BC, IEEE)
    store_row(tinv, t00, zero, zero, zero, ts, te, i_h, 0, HV, BT, BC)
    if NC > 1:
        store_row(tinv, t10, t11, zero, zero, ts, te, i_h, 1, HV, BT, BC)
    if NC > 2:
        store_row(tinv, t20, t21, t22, zero, ts, te, i_h, 2, HV, BT, BC)
        store_row(tinv, t30, t31, t32, t33, ts, te, i_h, 3, HV, BT, BC)
