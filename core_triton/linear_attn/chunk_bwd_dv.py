"""Backward of ``chunk_linear_attn``: the value gradient.

One program per (V tile, chunk slot, batch row x state head):

    dv = exp(b_tot - b)[:, None] * (k @ dh[slot])
         + scale * sum_{query heads of the group} (D^T * (k @ q^T)) @ do

``dh[slot]`` is the gradient of the state leaving the chunk
(chunk_bwd_state.py); ``D^T`` and ``k @ q^T`` are formed directly in
transposed orientation (no ``tl.trans`` of a product: see
chunk_bwd_dqk.py).

Inputs: ``q [B*T, HQ, K]``, ``k [B*T, H, K]``, ``gc``, ``g_gamma``,
``do [B*T, HQ, V]``, ``dh [slots, H, K, V]``, ``cu_seqlens``,
``chunk_offsets``.  Output: ``dv [B*T, H, V]`` in the inputs' dtype.
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot
from core_triton.linear_attn.chunk_common import chunk_gates, intra_decay, state_dot


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def chunk_bwd_dv_kernel(
    q,
    k,
    gc,
    g_gamma,
    do,
    dh,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    N,
    n_iter,
    NT,
    NS,
    dv,
    HQ: tl.constexpr,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STATE_F32: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    GROUP: tl.constexpr = HQ // H
    i_v = tl.program_id(0)
    i_s = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    _, _, _, ts, te, slot = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input: no rows, and its state slot was never written

    o_t = ts + tl.arange(0, BT).to(tl.int64)
    m_t = o_t < te
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_tv = m_t[:, None] & m_v[None, :]
    dh_base = dh + (slot * H + i_h) * K * V
    b, b_tot = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE)
    decay_t = intra_decay(b, m_t, BT, REVERSE, True) * scale

    acc = tl.zeros([BT, BV], dtype=tl.float32)
    for j in tl.static_range(GROUP):
        i_hq = i_h * GROUP + j
        scores_t = tl.zeros([BT, BT], dtype=tl.float32)  # [j, i] = k_j . q_i
        for i_k in range(0, tl.cdiv(K, BK)):
            o_k = i_k * BK + tl.arange(0, BK)
            m_k = o_k < K
            b_k = tl.load(
                k + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0
            )
            b_qt = tl.load(
                q + (o_t[None, :] * HQ + i_hq) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0
            )
            scores_t += dot(b_k, b_qt, PREC)
            if j == 0:
                b_dh = tl.load(
                    dh_base + o_k[:, None].to(tl.int64) * V + o_v[None, :],
                    mask=m_k[:, None] & m_v[None, :],
                    other=0,
                )
                acc += state_dot(b_k, b_dh, PREC, STATE_F32)
        if j == 0:
            acc = acc * tl.where(m_t, tl.exp(b_tot - b), 0.0)[:, None]
        b_do = tl.load(do + (o_t[:, None] * HQ + i_hq) * V + o_v[None, :], mask=m_tv, other=0)
        acc += dot((scores_t * decay_t).to(b_do.dtype), b_do, PREC)

    tl.store(dv + (o_t[:, None] * H + i_h) * V + o_v[None, :], acc.to(dv.dtype.element_ty), mask=m_tv)
