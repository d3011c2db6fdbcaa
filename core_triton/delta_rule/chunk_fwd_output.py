"""Forward output of the chunk-parallel gated delta rule.

One program per (V tile, chunk slot, batch row x value head):

    o = scale * ((q * exp(b)) h[slot] + P U)

with ``h[slot]`` the state entering the chunk and ``U`` its delta updates
(chunk_fwd_state.py), ``P`` the decayed scores: read from ``aqk``
(chunk_intra.py; always for per-channel gates), or formed here from ``q
k^T`` for scalar (or no) gates without ``P_FROM_AQK``.  Value head
``h`` reads query head ``h // (HV // HK)``.  Output ``o [B*T, HV, V]`` in
the inputs' dtype.
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import rows_tile, rows_tile_t, slot_chunk


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def delta_chunk_fwd_output_kernel(
    q,
    k,
    gc,
    h,
    aqk,
    u,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    N,
    n_iter,
    NT,
    NS,
    o,
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
    P_FROM_AQK: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    FROM_AQK: tl.constexpr = GATE == 2 or P_FROM_AQK
    i_v = tl.program_id(0)
    i_s, i_bh = tl.program_id(1), tl.program_id(2)
    i_h, i_hk, ts, te, slot = slot_chunk(
        cu_seqlens, chunk_offsets, i_s, i_bh, T, N, n_iter, NT, NS, HK, HV, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input
    o_t = ts + tl.arange(0, BT)
    m_t = o_t < te
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    h_base = h + (slot * HV + i_h) * K * V

    acc = tl.zeros([BT, BV], dtype=tl.float32)
    acc_p = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = rows_tile(q, o_t, m_t, HK, i_hk, K, o_k, m_k)
        if GATE == 2:
            b_q = b_q.to(tl.float32) * tl.exp(rows_tile(gc, o_t, m_t, HV, i_h, K, o_k, m_k))
        b_h = tl.load(
            h_base + o_k[:, None].to(tl.int64) * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0
        )
        if not FROM_AQK:
            acc_p += dot(b_q, rows_tile_t(k, o_t, m_t, HK, i_hk, K, o_k, m_k), PREC)
        # In h's dtype: the inputs' for half inputs (chunk.py).
        acc += dot(b_q.to(b_h.dtype), b_h, PREC)
    o_tt = tl.arange(0, BT)
    keep = m_t[:, None] & (o_tt[None, :] <= o_tt[:, None])
    if GATE == 1:
        b_g = tl.load(gc + o_t * HV + i_h, mask=m_t, other=0)
        acc = acc * tl.exp(b_g)[:, None]
    if FROM_AQK:
        b_p = tl.load(aqk + (o_t[:, None] * HV + i_h) * BT + o_tt[None, :], mask=keep, other=0).to(tl.float32)
    elif GATE == 1:
        b_p = acc_p * tl.exp(tl.where(keep, b_g[:, None] - b_g[None, :], float("-inf")))
    else:
        b_p = tl.where(keep, acc_p, 0.0)
    b_u = rows_tile(u, o_t, m_t, HV, i_h, V, o_v, m_v)
    out = (acc + dot(b_p.to(b_u.dtype), b_u, PREC)) * scale
    tl.store(
        o + (o_t[:, None] * HV + i_h) * V + o_v[None, :],
        out.to(o.dtype.element_ty),
        mask=m_t[:, None] & m_v[None, :],
    )
