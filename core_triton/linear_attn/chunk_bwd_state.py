"""Backward inter-chunk state pass of ``chunk_linear_attn``.

The gradient with respect to the state *leaving* each chunk, carried
against the visiting order (first to last with ``REVERSE``), starting from
the final state's cotangent ``dht``:

    dh[slot(c)] = G                                  (G = dL/d(state after chunk c))
    G = exp(b_tot) G + scale * sum_{query heads of the group} (q * exp(b)[:, None])^T do

and ``dh0 = G`` after the first chunk (the initial state's gradient; for an
empty sequence simply ``dht``).

The same two launch shapes as the forward (chunk_fwd_state.py): whole
sequences (:func:`chunk_bwd_state_kernel`), or segments
(:func:`chunk_bwd_state_segment_kernel`, a pass from zero that keeps
each segment's gradient and log decay, state_split's carry kernel, then a
pass from each segment's carried gradient that stores ``dh``).

Inputs: ``q [B*T, HQ, K]``, ``do [B*T, HQ, V]``, ``gc``, ``g_gamma``,
``dht [N, H, K, V]`` float32, ``cu_seqlens``, ``chunk_offsets``.
Outputs: ``dh [slots, H, K, V]`` (dtype of ``h``),
``dh0 [N, H, K, V]``.
"""

import triton
import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import segment_of_slot, sequence_chunks
from core_triton.linear_attn.chunk_common import chunk_gates, half_dot_acc, update_dot


@triton.jit
def grad_walk(
    grad,
    q,
    do,
    gc,
    g_gamma,
    dh,
    scale,
    i_h,
    bos,
    eos,
    slot0,
    c0,
    c1,
    o_k,
    o_v,
    HQ: tl.constexpr,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    REVERSE: tl.constexpr,
    STORE_DH: tl.constexpr,
    PREC: tl.constexpr,
    STATE_F32: tl.constexpr,
):
    """Carry the ``[BK, BV]`` gradient tile ``grad`` over chunks ``[c0,
    c1)`` against the visiting order, storing the gradient leaving each
    chunk into ``dh`` when ``STORE_DH``.  Returns ``(grad, log_decay)``:
    the gradient entering the first chunk walked... in visiting order, the
    gradient of the state entering chunk ``c0`` (``c1 - 1`` reversed), and
    the summed log decay of the chunks walked."""
    GROUP: tl.constexpr = HQ // H
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    log_decay = tl.sum(tl.zeros([1], dtype=tl.float32), axis=0)
    for it in range(0, (c1 - c0).to(tl.int32)):
        # Against the visiting order: last chunk first (forward direction).
        if REVERSE:
            c = c0 + it
        else:
            c = c1 - 1 - it
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        if STORE_DH:
            slot = slot0 + c
            tl.store(dh + (slot * H + i_h) * K * V + off_kv, grad.to(dh.dtype.element_ty), mask=m_kv)

        o_t = ts + tl.arange(0, BT).to(tl.int64)
        m_t = o_t < te
        b, b_tot = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE)
        decay_q = tl.where(m_t, tl.exp(b), 0.0)
        if STATE_F32:
            upd = tl.zeros_like(grad)
        else:
            # Half-precision products accumulate in place onto the decayed
            # gradient, the decay and scale on do's rows (q^T goes to the
            # tensor cores as loaded).
            upd = grad * tl.exp(b_tot)
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
            if STATE_F32:
                upd += update_dot(b_qt * decay_q[None, :], b_do, PREC, STATE_F32)
            else:
                upd = half_dot_acc(b_qt, b_do * (decay_q * scale)[:, None], upd, b_do, PREC, False)
        if STATE_F32:
            grad = grad * tl.exp(b_tot) + upd * scale
        else:
            grad = upd
        log_decay += b_tot
    return grad, log_decay


@jit(sizes=("T", "NT", "NS"))
def chunk_bwd_state_kernel(
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
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_nh = tl.program_id(2)
    i_n = i_nh // H
    i_h = i_nh % H
    bos, eos, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)

    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    state_row = (i_n.to(tl.int64) * H + i_h) * K * V

    grad = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        grad += tl.load(dht + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)
    grad, _ = grad_walk(
        grad, q, do, gc, g_gamma, dh, scale, i_h, bos, eos, slot0, slot0 * 0, n_chunks, o_k, o_v,
        HQ, H, K, V, BT, USE_G, USE_GAMMA, REVERSE, True, PREC, STATE_F32,
    )  # fmt: skip
    tl.store(dh0 + state_row + off_kv, grad.to(dh0.dtype.element_ty), mask=m_kv)


@jit(sizes=("T", "N", "n_iter", "NT", "NS", "NG", "S"))
def chunk_bwd_state_segment_kernel(
    q,
    do,
    gc,
    g_gamma,
    seg_start,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    N,
    n_iter,
    NT,
    NS,
    NG,
    S,
    out,
    seg_decay,
    HQ: tl.constexpr,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    STORE_DH: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STATE_F32: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """One segment's gradient walk.  ``STORE_DH`` False: from zero; ``out``
    is the segment's gradient ``[segments, H, K, V]`` float32 and
    ``seg_decay [segments, H]`` its log decay.  ``STORE_DH``: from
    ``seg_start``, the carried gradient leaving the segment; ``out`` is
    ``dh`` and ``seg_decay`` is not written."""
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    NV: tl.constexpr = triton.cdiv(V, BV)
    i_k = tl.program_id(0) // NV
    i_v = tl.program_id(0) % NV
    i_g = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    _, bos, eos, slot0, c0, c1, seg = segment_of_slot(
        cu_seqlens, chunk_offsets, i_g, i_b, T, N, n_iter, NT, NS, NG, S, BT, IS_VARLEN
    )
    if c1 <= c0:
        return  # a spare slot of packed input: no segment

    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    seg_row = (seg * H + i_h) * K * V

    grad = tl.zeros([BK, BV], dtype=tl.float32)
    if STORE_DH:
        grad += tl.load(seg_start + seg_row + off_kv, mask=m_kv, other=0)
    grad, log_decay = grad_walk(
        grad, q, do, gc, g_gamma, out, scale, i_h, bos, eos, slot0, c0, c1, o_k, o_v,
        HQ, H, K, V, BT, USE_G, USE_GAMMA, REVERSE, STORE_DH, PREC, STATE_F32,
    )  # fmt: skip
    if not STORE_DH:
        tl.store(out + seg_row + off_kv, grad, mask=m_kv)
        if (i_k == 0) & (i_v == 0):
            tl.store(seg_decay + seg * H + i_h, log_decay)
