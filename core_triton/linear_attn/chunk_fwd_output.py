"""Forward output of ``chunk_linear_attn``: inter-chunk plus intra-chunk.

One program per (V tile, chunk slot, batch row x query head):

    o = scale * (exp(b)[:, None] * (q @ h[slot]) + (D * (q @ k^T)) @ v)

with ``D`` the in-chunk decay mask (_chunk_la_common.intra_decay) and
``h[slot]`` the state entering the chunk (chunk_fwd_state.py).  Query head
``hq`` reads key/value/state head ``hq // (HQ // H)``.

Inputs: ``q [B*T, HQ, K]``, ``k [B*T, H, K]``, ``v [B*T, H, V]``, ``gc``,
``g_gamma``, ``h [slots, H, K, V]``, ``cu_seqlens``, ``chunk_offsets``.
Output: ``o [B*T, HQ, V]`` in the inputs' dtype.

Where the state pass splits over the sequence (state_split.py),
:func:`chunk_fwd_output_segment_kernel` computes the same output from each
segment's start state instead, walking the chunks with the state in
registers.
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot, segment_of_slot, sequence_chunks, sequence_segments
from core_triton.linear_attn.chunk_common import (
    carry_over_chunk,
    chunk_gates,
    half_dot_acc,
    intra_decay,
    state_dot,
)
from core_triton.linear_attn.state_split import carry_segments, start_tile


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def chunk_fwd_output_kernel(
    q,
    k,
    v,
    gc,
    g_gamma,
    h,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    N,
    n_iter,
    NT,
    NS,
    o,
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
    i_v = tl.program_id(0)
    i_s = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // HQ
    i_hq = i_bh % HQ
    i_h = i_hq // (HQ // H)
    _, _, _, ts, te, slot = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input: no rows, and its state slot was never written

    o_t = ts + tl.arange(0, BT).to(tl.int64)
    m_t = o_t < te
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    h_base = h + (slot * H + i_h) * K * V

    acc = tl.zeros([BT, BV], dtype=tl.float32)
    scores = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(
            q + (o_t[:, None] * HQ + i_hq) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0
        )
        b_kt = tl.load(
            k + (o_t[None, :] * H + i_h) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0
        )
        b_h = tl.load(
            h_base + o_k[:, None].to(tl.int64) * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0
        )
        acc += state_dot(b_q, b_h, PREC, STATE_F32)
        scores += dot(b_q, b_kt, PREC)

    b, _ = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE)
    b_v = tl.load(v + (o_t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0)
    scores = scores * intra_decay(b, m_t, BT, REVERSE, False)
    out = acc * tl.exp(b)[:, None] + dot(scores.to(b_v.dtype), b_v, PREC)
    out = out * scale
    tl.store(
        o + (o_t[:, None] * HQ + i_hq) * V + o_v[None, :],
        out.to(o.dtype.element_ty),
        mask=m_t[:, None] & m_v[None, :],
    )


@jit(sizes=("T", "N", "n_iter", "NT", "NS", "NG", "S"))
def chunk_fwd_output_segment_kernel(
    q,
    k,
    v,
    gc,
    g_gamma,
    seg_start,
    seg_delta,
    seg_decay,
    h0,
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
    o,
    final,
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
    CARRY: tl.constexpr,
    USE_H0: tl.constexpr,
    MIRROR: tl.constexpr,
    START_T: tl.constexpr,
    G_RAW: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """The output of the split state pass (core_triton/linear_attn/state_split.py)
    with no chunk states in memory: one program per (V tile, segment slot,
    batch row x state head) starts from ``seg_start [segments, H, K, V]``
    (float32, the state entering the segment) and walks the segment's
    chunks in visiting order; at each chunk it writes the output of every
    query head of the group (the formula of :func:`chunk_fwd_output_kernel`,
    with products in the inputs' dtype: see below), then carries the
    ``[BK, BV]`` float32 state (``BK >= K``: all of it) over the chunk as
    chunk_fwd_state does.  A storing pass would write ``h`` (``K/BT`` times
    as many elements as ``v``: four times ``v``'s bytes in float32 at
    K = 128 and 64-token chunks) for the output kernel to read back; here
    the state stays in registers, and the backward recomputes ``h`` from
    ``seg_start``.

    ``CARRY`` (a forward no gradient follows: no ``seg_start`` to keep)
    replaces state_split's carry launch: each program forms its segment's
    start state from ``h0 [N, H, K, V]`` (zero without ``USE_H0``) and the
    ``seg_delta``/``seg_decay`` of the segments visited before it (a
    few, read from L2), and the one walking a sequence's last segment
    stores the state it leaves with into ``final [N, H, K, V]`` (float32);
    program ``i_g < N`` also stores sequence ``i_g``'s ``final`` where that
    sequence has no chunk (packed input).  Without ``CARRY``, ``seg_start``
    is read and ``final`` left alone.  ``G_RAW``: ``gc`` is ``g``, its
    in-chunk cumsum formed here (chunk_common.chunk_gates).

    The backward's gradient walks (chunk.py, "gradient walks") run this kernel
    with the inputs in other roles: ``START_T`` reads each start state
    transposed (``seg_start [segments, H, V, K]``: ``h^T``, ``dh^T``), and
    ``MIRROR`` walks against the recurrence (each segment's chunks last to
    first, tokens within a chunk too) with the gates measured from the
    chunk's far end (``b' = b_tot - b``, the log decay a cotangent picks up
    on its way back), a state that carries ``scale`` itself (the
    cotangent's: ``dh``) and ``scale`` on the in-chunk term alone."""
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    GROUP: tl.constexpr = HQ // H
    i_v = tl.program_id(0)
    i_g = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    # The direction the chunks (and a chunk's tokens) are visited in.
    WALK_REVERSE: tl.constexpr = REVERSE != MIRROR
    if CARRY and IS_VARLEN:
        if i_g < N:
            # Sequence i_g's final state where it has no chunk (no segment
            # program walks it): the initial state, or zero.
            _, _, _, n_empty = sequence_chunks(cu_seqlens, chunk_offsets, i_g, T, NT, NS, BT, IS_VARLEN)
            if n_empty == 0:
                row = (i_g.to(tl.int64) * H + i_h) * K * V
                tl.store(final + row + off_kv, start_tile(h0, row, off_kv, m_kv, BK, BV, USE_H0), mask=m_kv)
    i_n, bos, eos, slot0, c0, c1, seg = segment_of_slot(
        cu_seqlens, chunk_offsets, i_g, i_b, T, N, n_iter, NT, NS, NG, S, BT, IS_VARLEN
    )
    if c1 <= c0:
        return  # a spare slot of packed input: no segment

    if CARRY:
        # The state entering this segment: the initial state carried over
        # the segments visited before it, as state_split's carry kernel
        # does (carry_segments).
        _, _, _, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)
        g0, n_seg = sequence_segments(i_n, slot0, n_chunks, NT, NG, S, IS_VARLEN)
        s_in = seg - g0  # this segment's place among its sequence's
        state_row = (i_n.to(tl.int64) * H + i_h) * K * V
        if REVERSE:
            n_before = n_seg - 1 - s_in
        else:
            n_before = s_in
        state = start_tile(h0, state_row, off_kv, m_kv, BK, BV, USE_H0)
        state = carry_segments(state, seg_delta, seg_decay, seg_start, g0, n_seg, n_before, i_h, off_kv, m_kv,
                               H, K, V, REVERSE, False)  # fmt: skip
    elif START_T:
        off_t = o_v[None, :].to(tl.int64) * K + o_k[:, None]
        state = tl.load(seg_start + (seg * H + i_h) * K * V + off_t, mask=m_kv, other=0)
    else:
        state = tl.load(seg_start + (seg * H + i_h) * K * V + off_kv, mask=m_kv, other=0)
    for it in range(0, (c1 - c0).to(tl.int32)):
        if WALK_REVERSE:
            c = c1 - 1 - it
        else:
            c = c0 + it
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        o_t = ts + tl.arange(0, BT).to(tl.int64)
        m_t = o_t < te
        b, b_tot = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE, G_RAW)
        if MIRROR:
            # From the chunk's far end: the decay from token i to where the
            # cotangent enters the chunk, excluding i's own gate.
            b = tl.where(m_t, b_tot - b, 0.0)
        b_kt = tl.load(
            k + (o_t[None, :] * H + i_h) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0
        )
        b_v = tl.load(
            v + (o_t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0
        )
        decay = intra_decay(b, m_t, BT, WALK_REVERSE, False) * scale
        if MIRROR:
            inter = tl.exp(b)  # the state carries the scale
        else:
            inter = tl.exp(b) * scale
        # Half-precision products: the state entering the chunk is rounded
        # for the output's product first and carried over the chunk before
        # the output is formed, so that the update (the walk's critical
        # path) overlaps the output's products and its float32 tile is not
        # live beside theirs (sm_90: 255 registers with spills -> 248
        # without; H100 chunk g forward B1 T32k 0.426 -> 0.410 ms).
        if not IEEE:
            s_half = state.to(b_v.dtype)
            state = carry_over_chunk(state, b_kt, b_v, b, b_tot, m_t, scale, MIRROR, PREC, IEEE)
        for j in tl.static_range(GROUP):
            i_hq = i_h * GROUP + j
            b_q = tl.load(
                q + (o_t[:, None] * HQ + i_hq) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0
            )
            scores = dot(b_q, b_kt, PREC) * decay
            # Half-precision operands unless the inputs are float32, here
            # and in the state's update, even where a per-token gate keeps the
            # chunk states float32 (STATE_F32): that is for the backward's
            # sake, which recomputes them from seg_start (written by the
            # float32 pass from zero); the states walked here reach only
            # this output, rounded as lightning's half-precision ones are.
            # Both products accumulate in place (half_dot_acc): the walk's
            # registers bound how many programs an SM holds.
            if IEEE:
                out = state_dot(b_q, state, PREC, IEEE) * inter[:, None]
            else:
                out = dot(b_q, s_half, PREC) * inter[:, None]
            out = half_dot_acc(scores, b_v, out, b_v, PREC, IEEE)
            tl.store(
                o + (o_t[:, None] * HQ + i_hq) * V + o_v[None, :],
                out.to(o.dtype.element_ty),
                mask=m_t[:, None] & m_v[None, :],
            )
        if IEEE:
            state = carry_over_chunk(state, b_kt, b_v, b, b_tot, m_t, scale, MIRROR, PREC, IEEE)
    if CARRY:
        if n_before == n_seg - 1:  # the sequence's last segment visited
            tl.store(final + state_row + off_kv, state, mask=m_kv)
