"""Backward inter-chunk state pass of ``chunk_linear_attn``.

The gradient with respect to the state *leaving* each chunk, carried
against the visiting order (first to last with ``REVERSE``), starting from
the final state's cotangent ``dht``:

    dh[slot(c)] = G                                  (G = dL/d(state after chunk c))
    G = exp(b_tot) G + scale * sum_{query heads of the group} (q * exp(b)[:, None])^T do

and ``dh0 = G`` after the first chunk (the initial state's gradient; for an
empty sequence simply ``dht``).

Inputs: ``q [B*T, HQ, K]``, ``do [B*T, HQ, V]``, ``gc``, ``g_gamma``,
``dht [N, H, K, V]`` float32, ``cu_seqlens``, ``chunk_offsets``.
Outputs: ``dh [slots, H, K, V]`` (dtype of ``h``), ``dh0 [N, H, K, V]``.
"""

import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_chunks
from core_triton.linear_attn.chunk_common import chunk_gates, update_dot


@jit(sizes=("T", "NT", "NS"))
def chunk_state_backward_kernel(
    q,
    do,
    gc,
    g_gamma,
    dht,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    NT,
    NS,
    dh,
    dh0,
    HQ: tl.constexpr,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    USE_DHT: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STATE_F32: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    GROUP: tl.constexpr = HQ // H
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_nh = tl.program_id(2)
    i_n = i_nh // H
    i_h = i_nh % H
    bos, eos, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)
    n_chunks = n_chunks.to(tl.int32)

    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    state_row = (i_n.to(tl.int64) * H + i_h) * K * V

    grad = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        grad += tl.load(dht + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)

    for it in range(0, n_chunks):
        # Against the visiting order: last chunk first (forward direction).
        if REVERSE:
            c = it
        else:
            c = n_chunks - 1 - it
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        slot = slot0 + c
        tl.store(dh + (slot * H + i_h) * K * V + off_kv, grad.to(dh.dtype.element_ty), mask=m_kv)

        o_t = ts + tl.arange(0, BT).to(tl.int64)
        m_t = o_t < te
        b, b_tot = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE)
        decay_q = tl.where(m_t, tl.exp(b), 0.0)
        upd = tl.zeros([BK, BV], dtype=tl.float32)
        for j in tl.static_range(GROUP):
            i_hq = i_h * GROUP + j
            # q^T loaded directly as [BK, BT].
            b_qt = tl.load(
                q + (o_t[None, :] * HQ + i_hq) * K + o_k[:, None],
                mask=m_k[:, None] & m_t[None, :],
                other=0,
            )
            b_do = tl.load(
                do + (o_t[:, None] * HQ + i_hq) * V + o_v[None, :],
                mask=m_t[:, None] & m_v[None, :],
                other=0,
            )
            upd += update_dot(b_qt * decay_q[None, :], b_do, PREC, STATE_F32)
        grad = grad * tl.exp(b_tot) + upd * scale

    tl.store(dh0 + state_row + off_kv, grad.to(dh0.dtype.element_ty), mask=m_kv)
