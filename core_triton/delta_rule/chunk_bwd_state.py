"""Backward inter-chunk state pass of the chunk-parallel gated delta rule.

From the forward (chunk_fwd_state.py, chunk_fwd_walk.py), per chunk with
``S`` entering it: ``U = Uv - W S``, ``o = scale ((q * exp(b)) S + P U)``,
``S' = exp(b_last) S + Kd^T U`` with ``Kd = k * exp(b_last - b)``.  With
``dS'`` the gradient of the state leaving the chunk, carried last chunk
first from the final state's cotangent ``dht``:

    dh[slot(c)] = dS'
    dU = scale P^T do + Kd dS'
    dS = exp(b_last) dS' + scale (q * exp(b))^T do - W^T dU

and ``dS`` after the first chunk is the initial state's gradient.

One program per (V tile, sequence x value head), all of K.  Inputs: ``q``
(with ``Q_DECAYED``, per-channel gates: ``Qd = q exp(b)`` from
chunk_fwd_wu.py, ``[B*T, HV, K]``), ``kd``, ``w`` (chunk_fwd_wu.py),
``gc``, ``aqk``, ``do [B*T, HV, V]``, ``dht``, ``cu_seqlens``,
``chunk_offsets``.  Outputs: ``dh [slots, HV, K, V]``, ``du [B*T, HV, V]``
float32 and ``dh0 [N, HV, K, V]``.
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import rows_tile, rows_tile_t, state_tile


@jit(sizes=("T", "NT", "NS"))
def delta_chunk_bwd_state_kernel(
    q,
    kd,
    w,
    gc,
    aqk,
    do,
    dht,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    NT,
    NS,
    dh,
    du,
    dh0,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    USE_H0: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    Q_DECAYED: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    i_h, bos, eos, slot0, n_chunks, o_k, o_v, m_k, m_v, m_kv, off_kv, state_row = state_tile(
        cu_seqlens, chunk_offsets, T, NT, NS, HV, K, V, BT, BK, BV, IS_VARLEN
    )
    i_hk = i_h // (HV // HK)
    o_tt = tl.arange(0, BT)

    dS = tl.load(dht + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)
    for it in range(0, n_chunks):
        c = n_chunks - 1 - it
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        tl.store(dh + ((slot0 + c) * HV + i_h) * K * V + off_kv, dS, mask=m_kv)
        o_t = ts + o_tt
        m_t = o_t < te
        last = te - 1
        b_kd = rows_tile(kd, o_t, m_t, HV, i_h, K, o_k, m_k).to(tl.float32)
        if Q_DECAYED:
            b_qt = rows_tile_t(q, o_t, m_t, HV, i_h, K, o_k, m_k).to(tl.float32)
        else:
            b_qt = rows_tile_t(q, o_t, m_t, HK, i_hk, K, o_k, m_k).to(tl.float32)
        decay_last = tl.zeros([BK], dtype=tl.float32) + 1.0
        if GATE == 1:
            b_qt = b_qt * tl.exp(tl.load(gc + o_t * HV + i_h, mask=m_t, other=0))[None, :]
            decay_last = decay_last * tl.exp(tl.load(gc + last * HV + i_h))
        if GATE == 2:
            if not Q_DECAYED:
                b_qt = b_qt * tl.exp(rows_tile_t(gc, o_t, m_t, HV, i_h, K, o_k, m_k))
            decay_last = tl.exp(tl.load(gc + (last * HV + i_h) * K + o_k, mask=m_k, other=0))
        # P^T loaded as such: element (j, i) = P[i, j], i >= j.
        b_pt = tl.load(
            aqk + (o_t[None, :] * HV + i_h) * BT + o_tt[:, None],
            mask=m_t[None, :] & (o_tt[:, None] <= o_tt[None, :]),
            other=0,
        )
        b_do = rows_tile(do, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32)
        b_du = dot(b_pt, b_do, PREC) * scale + dot(b_kd, dS, PREC)
        tl.store(du + (o_t[:, None] * HV + i_h) * V + o_v[None, :], b_du, mask=m_t[:, None] & m_v[None, :])
        b_wt = rows_tile_t(w, o_t, m_t, HV, i_h, K, o_k, m_k).to(tl.float32)
        dS = dS * decay_last[:, None] + dot(b_qt, b_do, PREC) * scale - dot(b_wt, b_du, PREC)
    if USE_H0:
        tl.store(dh0 + state_row + off_kv, dS.to(dh0.dtype.element_ty), mask=m_kv)
