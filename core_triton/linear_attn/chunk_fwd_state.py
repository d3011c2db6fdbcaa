"""Forward inter-chunk state pass of ``chunk_linear_attn``.

A walk over chunks in visiting order (last to first with ``REVERSE``)
stores the state entering each chunk and carries it on:

    h[slot(c)] = S                                   (state entering chunk c)
    S = exp(b_tot) S + (k * exp(b_tot - b)[:, None])^T v

Two launch shapes (core_triton/linear_attn/state_split.py chooses):

* whole sequences, :func:`chunk_fwd_state_kernel`: one program per (K tile,
  V tile, sequence x state head) walks all of its sequence's chunks from
  the initial state;
* segments, :func:`chunk_fwd_state_segment_kernel`: one program per (K x V
  tile, segment slot, batch row x state head) walks one segment's chunks.
  With ``STORE_H`` False it starts from zero and stores only where the
  segment leaves the state and the segment's log decay (the sum of its
  chunks' ``b_tot``); state_split's carry kernel turns those into the
  state entering every segment; with ``STORE_H`` it starts there and
  stores ``h``.  At batch 1 this fills the GPU where a whole-sequence walk
  has a few dozen programs stepping through hundreds of chunks.

Inputs: ``k [B*T, H, K]``, ``v [B*T, H, V]``, ``gc [B*T, H]`` float32,
``g_gamma [H]``, ``h0 [N, H, K, V]``, ``cu_seqlens [N+1]``,
``chunk_offsets [N+1]`` (see chunk_common).
Outputs: ``h [slots, H, K, V]`` (float32, or the inputs' half dtype: the
output and backward kernels multiply it on the tensor cores in that dtype),
``final [N, H, K, V]`` float32, the state after the last chunk.
"""

import triton
import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import segment_of_slot, sequence_chunks
from core_triton.linear_attn.chunk_common import carry_over_chunk, chunk_gates, update_dot


@triton.jit
def state_walk(
    state,
    k,
    v,
    gc,
    g_gamma,
    h,
    i_h,
    bos,
    eos,
    slot0,
    c0,
    c1,
    o_k,
    o_v,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    REVERSE: tl.constexpr,
    STORE_H: tl.constexpr,
    PREC: tl.constexpr,
    STATE_F32: tl.constexpr,
    G_RAW: tl.constexpr = False,
):
    """Carry the ``[BK, BV]`` tile ``state`` over chunks ``[c0, c1)`` of the
    sequence at rows ``[bos, eos)`` (chunk slots from ``slot0``), in
    visiting order, storing the state entering each chunk into ``h`` when
    ``STORE_H``; ``G_RAW``: ``gc`` is ``g`` (chunk_common.chunk_gates).
    Returns ``(state, log_decay)``: the state leaving the last chunk and the
    summed log decay of the chunks walked."""
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    log_decay = tl.sum(tl.zeros([1], dtype=tl.float32), axis=0)
    for it in range(0, (c1 - c0).to(tl.int32)):
        if REVERSE:
            c = c1 - 1 - it
        else:
            c = c0 + it
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        if STORE_H:
            slot = slot0 + c
            tl.store(h + (slot * H + i_h) * K * V + off_kv, state.to(h.dtype.element_ty), mask=m_kv)

        o_t = ts + tl.arange(0, BT).to(tl.int64)
        m_t = o_t < te
        b, b_tot = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE, G_RAW)
        # k^T loaded directly as [BK, BT] (no transpose of a product).
        b_kt = tl.load(
            k + (o_t[None, :] * H + i_h) * K + o_k[:, None],
            mask=(o_k < K)[:, None] & m_t[None, :],
            other=0,
        )
        b_v = tl.load(
            v + (o_t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & (o_v < V)[None, :], other=0
        )
        if STATE_F32:
            # Decay of each token's contribution to the end of the chunk; the
            # where() keeps rows past the chunk from overflowing exp.
            w = tl.where(m_t, tl.exp(b_tot - b), 0.0)
            state = state * tl.exp(b_tot) + update_dot(b_kt * w[None, :], b_v, PREC, STATE_F32)
        else:
            # One half-precision product accumulating in place.
            state = carry_over_chunk(state, b_kt, b_v, b, b_tot, m_t, 1.0, False, PREC, False)
        log_decay += b_tot
    return state, log_decay


@jit(sizes=("T", "NT", "NS"))
def chunk_fwd_state_kernel(
    k,
    v,
    gc,
    g_gamma,
    h0,
    cu_seqlens,
    chunk_offsets,
    T,
    NT,
    NS,
    h,
    final,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    USE_H0: tl.constexpr,
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

    state = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        state += tl.load(h0 + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)
    state, _ = state_walk(
        state, k, v, gc, g_gamma, h, i_h, bos, eos, slot0, slot0 * 0, n_chunks, o_k, o_v,
        H, K, V, BT, USE_G, USE_GAMMA, REVERSE, True, PREC, STATE_F32,
    )  # fmt: skip
    tl.store(final + state_row + off_kv, state, mask=m_kv)


@jit(sizes=("T", "N", "n_iter", "NT", "NS", "NG", "S"))
def chunk_fwd_state_segment_kernel(
    k,
    v,
    gc,
    g_gamma,
    seg_start,
    cu_seqlens,
    chunk_offsets,
    T,
    N,
    n_iter,
    NT,
    NS,
    NG,
    S,
    out,
    seg_decay,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    STORE_H: tl.constexpr,
    SKIP_LAST: tl.constexpr,
    G_RAW: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STATE_F32: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """One segment's walk (module docstring).  ``STORE_H`` False: from zero;
    ``out`` is the state leaving the segment ``[segments, H, K, V]``
    float32 and ``seg_decay [segments, H]`` its log decay, both left
    unwritten for each sequence's last segment visited (its last, or with
    ``REVERSE`` its first) with ``SKIP_LAST``; ``G_RAW``: ``gc`` is ``g``,
    its in-chunk cumsum formed here.  ``STORE_H``: from
    ``seg_start [segments, H, K, V]``; ``out`` is ``h`` and ``seg_decay``
    is not written."""
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
    if SKIP_LAST:
        if REVERSE:
            last = c0 == 0
        else:
            last = c1 * BT >= eos - bos
        if last:
            return  # whoever would read this delta walks the segment itself

    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    seg_row = (seg * H + i_h) * K * V

    state = tl.zeros([BK, BV], dtype=tl.float32)
    if STORE_H:
        state += tl.load(seg_start + seg_row + off_kv, mask=m_kv, other=0)
    state, log_decay = state_walk(
        state, k, v, gc, g_gamma, out, i_h, bos, eos, slot0, c0, c1, o_k, o_v,
        H, K, V, BT, USE_G, USE_GAMMA, REVERSE, STORE_H, PREC, STATE_F32, G_RAW,
    )  # fmt: skip
    if not STORE_H:
        tl.store(out + seg_row + off_kv, state, mask=m_kv)
        if (i_k == 0) & (i_v == 0):
            tl.store(seg_decay + seg * H + i_h, log_decay)
