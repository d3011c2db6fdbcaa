"""The Triton kernel behind both chunked cumulative sums.

The input is seen as ``x[b, t, f]`` with ``f = h * S + s`` (``S = 1`` for
scalar inputs), addressed through four strides so that time-first,
head-first and non-contiguous layouts need no copy.  Each program scans one
*window* of time for one tile of ``BF`` features, in blocks of ``BT``
tokens, carrying the running sum between blocks:

* local mode: a window is one chunk of ``chunk_size`` tokens of one
  sequence; program axis 0 enumerates chunks (for packed input, chunk slot
  ``i`` is mapped to its sequence by a binary search over the cumulative
  chunk counts ``chunk_offsets``);
* global mode: a window is a whole sequence; program axis 0 enumerates
  sequences.

A global scan with too few (sequence, feature-tile) pairs to fill the GPU
runs as two local-mode launches over chunks of ``CHUNK`` tokens instead:
``PASS=1`` writes each chunk's total to ``out`` (``[slots, rows, F]``
float32), and ``PASS=2`` starts each chunk's scan from the sum of the totals
of the chunks before it (``REVERSE``: after it) in the same sequence.

Sums are accumulated in float32 and cast to the output's dtype on store.
All offsets are 64-bit so tensors past 2**31 elements index correctly.
"""

import triton
import triton.language as tl


@triton.jit
def _find_sequence(chunk_offsets, i_c, N, n_iter):
    """Largest ``n`` in ``[0, N)`` with ``chunk_offsets[n] <= i_c``: the
    sequence that owns chunk slot ``i_c`` (empty sequences own no slot)."""
    lo = i_c * 0
    hi = lo + N - 1
    for _ in range(n_iter):
        mid = (lo + hi + 1) // 2
        ok = tl.load(chunk_offsets + mid) <= i_c
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _hint16(stride, DIVISIBLE: tl.constexpr):
    """Tell the compiler an int is a multiple of 16 when the plan says so.

    Triton specialises such ints itself when torch launches a kernel, but
    jax-triton passes scalars without that hint, and the loads then lose
    their 16-byte vectorisation (6x slower here).  Hinting in the kernel
    gives both bindings the same compiled code."""
    if DIVISIBLE:
        stride = tl.multiple_of(stride, 16)
    return stride


@triton.jit
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
    GLOBAL: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    DIV16: tl.constexpr,
    PASS: tl.constexpr,
):
    # Bit k of DIV16: the k-th of (xb, xt, xh, ob, ot, oh, T, F) is a
    # multiple of 16 (and not 1, which Triton makes a constant).  The layout
    # Triton picks, and so the order of the float sums, follows these facts:
    # the same hints make both bindings give the same bits.
    stride_xb = _hint16(stride_xb, (DIV16 & 1) != 0)
    stride_xt = _hint16(stride_xt, (DIV16 & 2) != 0)
    stride_xh = _hint16(stride_xh, (DIV16 & 4) != 0)
    stride_ob = _hint16(stride_ob, (DIV16 & 8) != 0)
    stride_ot = _hint16(stride_ot, (DIV16 & 16) != 0)
    stride_oh = _hint16(stride_oh, (DIV16 & 32) != 0)
    T = _hint16(T, (DIV16 & 64) != 0)
    F = _hint16(F, (DIV16 & 128) != 0)
    i_w = tl.program_id(0)
    i_b = tl.program_id(1).to(tl.int64)
    i_f = tl.program_id(2)

    # Window [ws, we) of the packed or batched time axis.
    if GLOBAL:
        if IS_VARLEN:
            ws = tl.load(cu_seqlens + i_w).to(tl.int64)
            we = tl.load(cu_seqlens + i_w + 1).to(tl.int64)
        else:
            ws = i_w.to(tl.int64) * 0
            we = ws + T
    else:
        if IS_VARLEN:
            # The grid is sized before cu_seqlens' values are known, so slots
            # past the real chunk count get an empty window.
            valid = i_w < tl.load(chunk_offsets + N)
            i_n = _find_sequence(chunk_offsets, i_w, N, n_iter)
            bos = tl.load(cu_seqlens + i_n).to(tl.int64)
            eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
            first = tl.load(chunk_offsets + i_n)
            last = tl.where(valid, tl.load(chunk_offsets + i_n + 1), first)
            ws = bos + (i_w - first).to(tl.int64) * CHUNK
            eos = tl.where(valid, eos, ws)
        else:
            eos = i_w.to(tl.int64) * 0 + T
            ws = i_w.to(tl.int64) * CHUNK
            first = i_w * 0
            last = (T + CHUNK - 1) // CHUNK
        we = tl.minimum(ws + CHUNK, eos)
    # Guard against cu_seqlens that were not checked (traced under jit).
    we = tl.minimum(we, T)

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
            j_lo, j_hi = i_w + 1, last
        else:
            j_lo, j_hi = first, tl.minimum(i_w, last)
        for j in range(j_lo, j_hi):
            row = (i_b + j * n_rows) * F  # i_b is int64, so is row
            carry += tl.load(totals + row + o_f, mask=m_f, other=0)
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
