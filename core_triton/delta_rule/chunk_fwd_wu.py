"""W, Uv and Kd of the chunk-parallel gated delta rule (chunk_intra.py
defines them and computes ``Tinv``).

One program per (chunk slot, batch row x value head):

    W  = Tinv (beta k exp(b))        [BT, K]
    Uv = Tinv (beta v)               [BT, V]
    Kd = k exp(b_last - b)           [BT, K]
    Qd = q exp(b)                    [BT, K]  (per-channel gates' backward)

(per key channel for ``gk``).  Outputs ``w``, ``kd``, ``qd [B*T, HV, K]``
and ``uv [B*T, HV, V]``: float32, or the inputs' dtype for half inputs
(chunk.py), computed in float32 and rounded once.  ``Qd`` spares the
backward state pass (chunk_bwd_state.py) the per-channel decays of every
chunk, once per value tile, on its serial walk.
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import rows_tile, slot_chunk


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_fwd_wu_kernel(
    q,
    k,
    v,
    beta,
    gc,
    tinv,
    cu_seqlens,
    chunk_offsets,
    T,
    N,
    n_iter,
    NT,
    NS,
    w,
    uv,
    kd,
    qd,
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
    STORE_KD: tl.constexpr,
    STORE_QD: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    i_s, i_bh = tl.program_id(0), tl.program_id(1)
    i_h, i_hk, ts, te, _ = slot_chunk(
        cu_seqlens, chunk_offsets, i_s, i_bh, T, N, n_iter, NT, NS, HK, HV, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input
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
        if STORE_KD:
            tl.store(kd + p_w, b_kd, mask=m_t[:, None] & m_k[None, :])
        if STORE_QD:
            tl.static_assert(GATE == 2)  # (b_gk: per-channel gates only)
            b_q = rows_tile(q, o_t, m_t, HK, i_hk, K, o_k, m_k).to(tl.float32)
            tl.store(qd + p_w, b_q * tl.exp(b_gk), mask=m_t[:, None] & m_k[None, :])
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_v = rows_tile(v, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32) * b_beta[:, None]
        p_u = (o_t[:, None] * HV + i_h) * V + o_v[None, :]
        tl.store(uv + p_u, dot(b_tinv, b_v, PREC), mask=m_t[:, None] & m_v[None, :])
