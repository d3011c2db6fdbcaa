"""The Triton kernel behind both chunked cumulative sums.

The input is seen as ``x[b, t, f]`` with ``f = h * S + s`` (``S = 1`` for
scalar inputs), addressed through four strides so that time-first,
head-first and non-contiguous layouts need no copy.  Each program scans one
*window* of time for one tile of ``BF`` features, in blocks of ``BT``
tokens, carrying the running sum between blocks:

a window is one chunk of ``CHUNK`` tokens of one sequence; program axis 0
enumerates chunk slots (for packed input, chunk slot ``i`` is mapped to its
sequence by a binary search over the cumulative chunk counts
``chunk_offsets``, clamped as core_triton.common.sequences says).

A whole-sequence (global) scan is two launches over chunks of a fixed
``CHUNK``: ``PASS=1`` writes each chunk's total to ``out`` (``[slots, rows,
F]`` float32), and ``PASS=2`` starts each chunk's scan from the sum of the
totals of the chunks before it (``REVERSE``: after it) in the same
sequence.  So no block size follows the sequence length or the number of
sequences, and a new length compiles nothing.

Sums are accumulated in float32 and cast to the output's dtype on store.
All offsets are 64-bit so tensors past 2**31 elements index correctly.
"""

import triton.language as tl

from core_triton.common.kernel_helpers import stride_hint
from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_chunks, slot_sequence


@jit(sizes=("T", "N", "n_iter", *(f"stride_{a}{b}" for a in "xo" for b in "bths")))
def segment_cumsum_kernel(
    x,
    cu_seqlens,
    chunk_offsets,
    totals,
    T,
    F,
    N,
    n_iter,
    stride_xb,
    stride_xt,
    stride_xh,
    stride_xs,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_os,
    scale,
    out,
    S: tl.constexpr,
    CHUNK: tl.constexpr,
    BT: tl.constexpr,
    BF: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    DIV16: tl.constexpr,
    UNIT: tl.constexpr,
    PASS: tl.constexpr,
    BJ: tl.constexpr,
    FT: tl.constexpr,
):
    # Bit k of DIV16 (UNIT): the k-th of (xb, xt, xh, xs, ob, ot, oh, os) is
    # a multiple of 16 (equal to 1) whatever the length.  The layout Triton
    # picks, and so the order of the float sums, follows these facts: the
    # same facts make both bindings give the same bits.
    stride_xb = stride_hint(stride_xb, (DIV16 & 1) != 0, (UNIT & 1) != 0)
    stride_xt = stride_hint(stride_xt, (DIV16 & 2) != 0, (UNIT & 2) != 0)
    stride_xh = stride_hint(stride_xh, (DIV16 & 4) != 0, (UNIT & 4) != 0)
    stride_xs = stride_hint(stride_xs, (DIV16 & 8) != 0, (UNIT & 8) != 0)
    stride_ob = stride_hint(stride_ob, (DIV16 & 16) != 0, (UNIT & 16) != 0)
    stride_ot = stride_hint(stride_ot, (DIV16 & 32) != 0, (UNIT & 32) != 0)
    stride_oh = stride_hint(stride_oh, (DIV16 & 64) != 0, (UNIT & 64) != 0)
    stride_os = stride_hint(stride_os, (DIV16 & 128) != 0, (UNIT & 128) != 0)
    F = stride_hint(F, (DIV16 & 256) != 0, False)  # bit 8: the feature count
    i_w = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)

    # Window [ws, we) of the packed or batched time axis; the sequence's
    # chunks are slots [first, last).
    if IS_VARLEN:
        # (chunk_offsets carries each slot's sequence; n_iter, the bound of
        # the binary search that table replaced, is no longer read)
        i_n = slot_sequence(chunk_offsets, i_w, N, T, CHUNK)
        bos, eos, first, n_chunks = sequence_chunks(
            cu_seqlens, chunk_offsets, i_n, T, 0, tl.num_programs(0), CHUNK, True
        )
        last = first + n_chunks
        c = i_w.to(tl.int64) - first
        ws = bos + c * CHUNK
        # A slot that holds no chunk (the grid is sized before cu_seqlens'
        # values are known) gets an empty window.
        we = tl.where((c >= 0) & (c < n_chunks), tl.minimum(ws + CHUNK, eos), ws)
    else:
        ws = i_w.to(tl.int64) * CHUNK
        we = tl.minimum(ws + CHUNK, T)
        first = i_w.to(tl.int64) * 0
        last = first + (T + CHUNK - 1) // CHUNK

    # FT feature tiles per program, one after another: a packed window's
    # lookup (a binary search over chunk_offsets, then its bounds) is paid
    # once for them.
    for i_ft in range(FT):
        i_f = tl.program_id(2) * FT + i_ft
        o_f = i_f * BF + tl.arange(0, BF)
        m_f = o_f < F
        o_h = (o_f // S).to(tl.int64)
        o_s = (o_f % S).to(tl.int64)
        off_x = i_b * stride_xb + o_h * stride_xh + o_s * stride_xs
        off_o = i_b * stride_ob + o_h * stride_oh + o_s * stride_os

        carry = tl.zeros([BF], dtype=tl.float32)
        if PASS == 2:
            # Start from the totals of the sequence's other chunks on our side.
            n_rows = tl.num_programs(1)
            if REVERSE:
                j_lo, j_hi = i_w.to(tl.int64) + 1, last
            else:
                j_lo, j_hi = first, tl.minimum(i_w.to(tl.int64), last)
            # BJ chunk totals a load: a sequence of thousands of chunks costs
            # thousands / BJ steps, not one step a chunk.
            for j0 in range(j_lo, j_hi, BJ):
                o_j = j0 + tl.arange(0, BJ).to(tl.int64)
                rows = (i_b + o_j * n_rows) * F  # i_b is int64, so are the rows
                m_j = (o_j < j_hi)[:, None] & m_f[None, :]
                carry += tl.sum(tl.load(totals + rows[:, None] + o_f[None, :], mask=m_j, other=0), axis=0)
        n_blocks = tl.cdiv(tl.maximum(we - ws, 0), BT).to(tl.int32)
        for i in range(0, n_blocks):
            if REVERSE:
                o_t = we - (i + 1) * BT + tl.arange(0, BT).to(tl.int64)
            else:
                o_t = ws + i * BT + tl.arange(0, BT).to(tl.int64)
            m = ((o_t >= ws) & (o_t < we))[:, None] & m_f[None, :]
            b = tl.load(x + off_x[None, :] + o_t[:, None] * stride_xt, mask=m, other=0).to(tl.float32)
            if PASS != 1:
                y = tl.cumsum(b, axis=0, reverse=REVERSE) + carry[None, :]
                if HAS_SCALE:
                    y = y * scale
                tl.store(out + off_o[None, :] + o_t[:, None] * stride_ot, y.to(out.dtype.element_ty), mask=m)
            carry += tl.sum(b, axis=0)
        if PASS == 1:
            row = (i_w.to(tl.int64) * tl.num_programs(1) + i_b) * F
            tl.store(out + row + o_f, carry, mask=m_f)
