"""Where each sequence lies: the one place every kernel reads ``cu_seqlens``.

Packed input (``batch == 1``) concatenates ``N`` sequences along time and
gives their boundaries in ``cu_seqlens [N+1]``.  Under ``jax.jit`` (or with
the eager check skipped) those values are never seen on the host, so the
kernels must stay inside their tensors whatever they hold:

* sequence ``n`` covers rows ``[bos, eos)`` with ``bos = clamp(cu[n], 0, T)``
  and ``eos = clamp(cu[n+1], bos, T)``: inside the time axis, never
  negative in length;
* chunk slots (``chunk_offsets [N+1]``, the cumulative chunk counts) are
  clamped into ``[0, NS)``, the slots the buffers were sized for, and a
  sequence gets no more slots than are left after its first.

Rows that no sequence covers (before ``cu[0]``, past ``cu[N]``) are never
written by a kernel; the plans zero-fill the outputs of packed calls, or
zero those rows after the kernels (:func:`zero_uncovered_plan`), so those
tokens get output 0 and gradient 0.  For valid ``cu_seqlens`` the
clamps change nothing; for invalid ones (decreasing entries) sequences may
overlap, and the values of overlapping rows are unspecified, but every
access stays in bounds.

``T`` is the length of the time axis; batched (unpacked) input has ``N =
B`` sequences of ``T`` rows each on the flattened ``B*T`` axis.
"""

import functools

import triton
import triton.language as tl

from core_triton.common.launch import In, LaunchPlan, OutputSpec
from core_triton.common.runtime import jit
from core_triton.common.utils import cdiv, next_power_of_2, prod


@triton.jit
def sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN: tl.constexpr):
    """First and one-past-last row of sequence ``i_n`` on the flattened
    ``B*T`` axis, int64, clamped as the module docstring says."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        bos = tl.minimum(tl.maximum(bos, 0), T)
        eos = tl.minimum(tl.maximum(eos, bos), T)
    else:
        bos = i_n.to(tl.int64) * T
        eos = bos + T
    return bos, eos


@triton.jit
def block_bounds(cu_seqlens, i, m, T):
    """``(bos, eos)`` int64 of sequences ``i`` (a block of indices, ``m``
    the valid ones: 0 elsewhere), clamped as :func:`sequence_bounds` does."""
    bos = tl.load(cu_seqlens + i, mask=m, other=0).to(tl.int64)
    eos = tl.load(cu_seqlens + i + 1, mask=m, other=0).to(tl.int64)
    bos = tl.minimum(tl.maximum(bos, 0), T)
    eos = tl.minimum(tl.maximum(eos, bos), T)
    return bos, eos


@triton.jit
def block_chunks(cu_seqlens, i, m, T, CHUNK: tl.constexpr):
    """Counts (int64) of ``CHUNK``-token chunks of sequences ``i`` (a block
    of indices, ``m`` the valid ones: 0 elsewhere), their bounds clamped as
    :func:`block_bounds` clamps them."""
    bos, eos = block_bounds(cu_seqlens, i, m, T)
    return (eos - bos + CHUNK - 1) // CHUNK


@triton.jit
def sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """``(bos, eos, slot0, n_chunks)`` of sequence ``i_n``: its rows, the slot
    of its first chunk of ``BT`` rows, and how many of its chunks have a
    slot.  Slots ``slot0 .. slot0 + n_chunks - 1`` all lie in ``[0, NS)``.
    Batched input: ``NT`` chunks per batch row, ``slot0 = i_n * NT``."""
    bos, eos = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    if IS_VARLEN:
        slot0 = tl.load(chunk_offsets + i_n).to(tl.int64)
        slot0 = tl.minimum(tl.maximum(slot0, 0), NS)
        n_chunks = tl.minimum(tl.cdiv(eos - bos, BT), NS - slot0)
    else:
        slot0 = i_n.to(tl.int64) * NT
        n_chunks = (slot0 * 0 + NT).to(tl.int64)
    return bos, eos, slot0, n_chunks


@triton.jit
def find_sequence(chunk_offsets, i_c, N, n_iter):
    """Largest ``n`` in ``[0, N)`` with ``chunk_offsets[n] <= i_c``: the
    sequence that owns chunk slot ``i_c`` (empty sequences own no slot).
    A binary search of ``n_iter >= log2(N) + 1`` steps; whatever the
    offsets hold, the result is in ``[0, max(N, 1))`` and every load reads
    ``chunk_offsets[0 .. N]``."""
    lo = i_c * 0
    hi = lo + N - 1
    for _ in range(n_iter):
        mid = tl.minimum(tl.maximum((lo + hi + 1) // 2, 0), N)
        ok = tl.load(chunk_offsets + mid) <= i_c
        lo = tl.where(ok & (mid <= hi), mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def chunk_of_slot(
    cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT: tl.constexpr, IS_VARLEN: tl.constexpr
):
    """Where chunk slot ``i_s`` of batch row ``i_b`` lies.

    Returns ``(i_n, bos, eos, ts, te, slot)``: its sequence and that
    sequence's rows ``[bos, eos)``, the chunk's own rows ``[ts, te)`` (empty,
    ``ts == te``, for a slot that holds no chunk: the spare slots of packed
    input, whose grid is sized before ``cu_seqlens`` is known) and its index
    into the chunk-state buffers (``< NS``).  ``chunk_offsets`` is
    :func:`chunk_offsets_kernel`'s output for ``BT``-row chunks, its slot
    table included; ``n_iter`` is no longer read (the binary search it
    bounded gave way to that table) and stays for the callers."""
    if IS_VARLEN:
        i_n = slot_sequence(chunk_offsets, i_s, N, T, BT)
        bos, eos, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)
        c = i_s.to(tl.int64) - slot0
        valid = (c >= 0) & (c < n_chunks)
        ts = tl.where(valid, bos + c * BT, bos)
        te = tl.where(valid, tl.minimum(ts + BT, eos), bos)
        slot = i_s.to(tl.int64)
    else:
        i_n = i_b
        bos = i_b.to(tl.int64) * T
        eos = bos + T
        ts = bos + i_s.to(tl.int64) * BT
        te = tl.minimum(ts + BT, eos)
        slot = i_b.to(tl.int64) * NT + i_s
    return i_n, bos, eos, ts, te, slot


@triton.jit
def sequence_segments(i_n, slot0, n_chunks, NT, NG, S, IS_VARLEN: tl.constexpr):
    """``(g0, n_seg)``: the segment slot of sequence ``i_n``'s first segment
    and its number of segments.  A *segment* is a run of ``S`` consecutive
    chunks of one sequence from its first chunk (the last may be shorter).

    Packed input places them by chunk slot: ``g0 = slot0 // S + i_n``
    (``slot0`` as :func:`sequence_chunks` clamps it), so that whatever
    ``cu_seqlens`` holds, sequences' segment slots never overlap, stay
    below ``NG = NS // S + N`` and cover every chunk that has a slot (the
    state passes then write every state slot the later kernels read).
    Batched input: ``NG = cdiv(NT, S)`` segments per batch row."""
    if IS_VARLEN:
        g0 = slot0 // S + i_n
        n_seg = tl.minimum(tl.cdiv(n_chunks, S), tl.maximum(NG - g0, 0))
    else:
        g0 = i_n.to(tl.int64) * NG
        n_seg = (g0 * 0 + tl.cdiv(NT, S)).to(tl.int64)
    return g0, n_seg


@triton.jit
def find_segment_sequence(chunk_offsets, i_g, N, n_iter, NS, S):
    """Largest ``n`` in ``[0, N)`` whose first segment slot (``clamp(
    chunk_offsets[n], 0, NS) // S + n``, increasing in ``n``) is at most
    ``i_g``: the sequence that owns segment slot ``i_g`` if any does.  The
    binary search of :func:`find_sequence`."""
    lo = i_g * 0
    hi = lo + N - 1
    for _ in range(n_iter):
        mid = tl.minimum(tl.maximum((lo + hi + 1) // 2, 0), N)
        first = tl.minimum(tl.maximum(tl.load(chunk_offsets + mid).to(tl.int64), 0), NS) // S + mid
        ok = first <= i_g
        lo = tl.where(ok & (mid <= hi), mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def segment_of_slot(
    cu_seqlens,
    chunk_offsets,
    i_g,
    i_b,
    T,
    N,
    n_iter,
    NT,
    NS,
    NG,
    S,
    BT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """Where segment slot ``i_g`` of batch row ``i_b`` lies (segments: see
    :func:`sequence_segments`).

    Returns ``(i_n, bos, eos, slot0, c0, c1, seg)``: its sequence, that
    sequence's rows and the chunk slot of its first chunk, the segment's
    chunks ``[c0, c1)`` counted from the sequence's first (empty for a slot
    that holds no segment: packed input's grid is sized before
    ``cu_seqlens`` is known) and its index into the segment buffers
    (``< NG`` packed, ``< B * NG`` batched)."""
    if IS_VARLEN:
        i_n = find_segment_sequence(chunk_offsets, i_g, N, n_iter, NS, S)
    else:
        i_n = i_b
    bos, eos, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)
    g0, n_seg = sequence_segments(i_n, slot0, n_chunks, NT, NG, S, IS_VARLEN)
    if IS_VARLEN:
        s = i_g.to(tl.int64) - g0
        seg = i_g.to(tl.int64)
    else:
        s = i_g.to(tl.int64)
        seg = g0 + s
    valid = (s >= 0) & (s < n_seg)
    c0 = tl.where(valid, s * S, 0)
    c1 = tl.where(valid, tl.minimum(c0 + S, n_chunks), 0)
    return i_n, bos, eos, slot0, c0, c1, seg


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@jit(sizes=("N", "T", "NS"))
def chunk_offsets_kernel(cu_seqlens, N, T, NS, out, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """``out [N + 1 + NS]`` int32, ``NS = cdiv(T, CHUNK) + N`` (the chunk
    slots of packed input):

    * ``out[:N+1]``: cumulative counts of ``CHUNK``-token chunks of the
      sequences as :func:`sequence_bounds` clamps them, so that an entry
      that breaks the contract takes no chunk slot from the sequences after
      it (for valid ``cu_seqlens``: ``prepare_chunk_offsets``);
    * ``out[N+1:]``: for each slot, the sequence that owns it, as
      :func:`find_sequence` finds it (the largest ``n`` whose offset is at
      most the slot), so that a program of a chunk slot reads its sequence
      in one load (:func:`slot_sequence`) instead of ``log2(N)`` dependent
      ones.  Each sequence that has chunks (and the last one) marks its
      first slot; a running maximum over the slots fills the rest.

    One program, ``BLOCK`` sequences or slots a step; the steps of one
    phase complete (a barrier) before the next reads what they wrote."""
    table = out + N + 1
    carry = tl.sum(tl.zeros([BLOCK], dtype=tl.int32), axis=0)
    for s0 in range(0, NS, BLOCK):
        o_s = s0 + tl.arange(0, BLOCK)
        tl.store(table + o_s, tl.zeros([BLOCK], dtype=tl.int32), mask=o_s < NS)
    tl.debug_barrier()
    tl.store(out, carry)
    for b0 in range(0, N, BLOCK):
        i = b0 + tl.arange(0, BLOCK)
        m = i < N
        n = tl.where(m, block_chunks(cu_seqlens, i, m, T, CHUNK), 0).to(tl.int32)
        ends = tl.cumsum(n, axis=0) + carry
        tl.store(out + 1 + i, ends, mask=m)
        # Sequences without chunks share their first slot with the next
        # one that has some (or are the last): the largest index marks it.
        first = ends - n
        tl.store(table + first, i, mask=m & ((n > 0) | (i == N - 1)) & (first < NS))
        carry += tl.sum(n, axis=0)
    tl.debug_barrier()
    owner = carry * 0
    for s0 in range(0, NS, BLOCK):
        o_s = s0 + tl.arange(0, BLOCK)
        m_s = o_s < NS
        # (.cg: from L2, where the marks went, never a line this SM cached)
        marks = tl.load(table + o_s, mask=m_s, other=0, cache_modifier=".cg")
        marks = tl.maximum(tl.associative_scan(marks, 0, _max), owner)
        tl.store(table + o_s, marks, mask=m_s)
        owner = tl.max(marks, axis=0)


@triton.jit
def slot_sequence(chunk_offsets, i_s, N, T, BT: tl.constexpr):
    """The sequence that owns chunk slot ``i_s`` (:func:`find_sequence`'s
    answer) from the table that :func:`chunk_offsets_kernel` writes after
    the ``N + 1`` offsets of ``BT``-token chunks of ``T`` rows; in ``[0,
    max(N, 1))``, and every load inside the table whatever ``i_s`` is."""
    i = tl.minimum(tl.maximum(i_s, 0), (T + BT - 1) // BT + N - 1)
    n = tl.load(chunk_offsets + N + 1 + i)
    return tl.minimum(tl.maximum(n, 0), tl.maximum(N - 1, 0))


@functools.lru_cache(maxsize=256)
def chunk_offsets_plan(n_seq: int, seq_len: int, chunk: int, output_name: str) -> LaunchPlan:
    """The launch that turns input ``cu_seqlens [n_seq+1]`` into the chunk
    offsets the chunk kernels read, and each chunk slot's sequence
    (:func:`chunk_offsets_kernel`)."""
    n_slots = cdiv(seq_len, chunk) + n_seq  # packed input's chunk slots
    return LaunchPlan(
        kernel=chunk_offsets_kernel,
        grid=(1,),
        params=(In("cu_seqlens"), n_seq, seq_len, n_slots),
        outputs=(OutputSpec((n_seq + 1 + n_slots,), "int32"),),
        output_names=(output_name,),
        constexprs=dict(CHUNK=chunk, BLOCK=1024),
        num_warps=4,
        num_stages=1,
    )


@jit(sizes=("N", "T", "NS"))
def zero_uncovered_kernel(x_in, cu_seqlens, chunk_offsets, N, T, NS, x, R: tl.constexpr, BT: tl.constexpr,
                          BR: tl.constexpr, BN: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """Zero the rows of ``x [P, T, R]`` (in place; ``x_in`` is the same
    buffer) that the op's kernels leave unwritten: rows no sequence covers
    as :func:`sequence_bounds` clamps them and, for chunked kernels
    (``CHUNK`` > 0, ``chunk_offsets`` and ``NS`` as :func:`sequence_chunks`
    reads them), rows of chunks that got no slot (only where ``cu_seqlens``
    breaks the contract: overlapping sequences can use up the slots).
    That is what a packed output's zero fill did for those rows, without
    writing the rows the kernels write anyway.

    Program ``(i, p)`` takes rows ``[i*BT, (i+1)*BT)`` of slice ``p``: it
    reads every sequence's bounds, ``BN`` at a time, and returns at once
    where they cover its rows (the valid case); else it writes zeros in the
    rows left, ``BR`` columns at a time.  Those rows are any set (clamped
    sequences leave gaps where ``cu_seqlens`` decreases)."""
    rows = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    covered = tl.zeros([BT], dtype=tl.int32)
    for n0 in range(0, N, BN):
        o_n = n0 + tl.arange(0, BN)
        m_n = o_n < N
        bos, eos = block_bounds(cu_seqlens, o_n, m_n, T)
        if CHUNK > 0:
            slot0 = tl.load(chunk_offsets + o_n, mask=m_n, other=0).to(tl.int64)
            slot0 = tl.minimum(tl.maximum(slot0, 0), NS)
            n_chunks = tl.minimum(tl.cdiv(eos - bos, CHUNK), NS - slot0)
            eos = tl.minimum(eos, bos + n_chunks * CHUNK)
        inside = (bos[None, :] <= rows[:, None]) & (rows[:, None] < eos[None, :]) & m_n[None, :]
        covered = tl.maximum(covered, tl.max(inside.to(tl.int32), axis=1))
    zero = (covered == 0) & (rows < T)
    if tl.max(zero.to(tl.int32), axis=0) > 0:
        base = (tl.program_id(1).to(tl.int64) * T + rows) * R
        for r0 in range(0, R, BR):
            o_r = r0 + tl.arange(0, BR)
            tl.store(x + base[:, None] + o_r[None, :], tl.zeros([BT, BR], dtype=x.dtype.element_ty),
                     mask=zero[:, None] & (o_r < R)[None, :])  # fmt: skip


def zero_uncovered_plan(
    name: str, shape: tuple[int, ...], dtype: str, axis: int, n_seq: int, chunk: int = 0, n_slots: int = 0
) -> LaunchPlan:
    """The launch that zeroes, in place, the rows of output ``name``
    (``shape``, ``dtype``; its time axis ``axis``, of packed input's ``B *
    T == T`` rows) that the op's kernels leave unwritten
    (:func:`zero_uncovered_kernel`): rows no sequence of input ``cu_seqlens
    [n_seq+1]`` covers and, for kernels that take ``chunk``-row chunks by
    slot (input ``chunk_offsets``, ``n_slots`` slots), rows of chunks with
    no slot.  The output can then be allocated unfilled and this launch run
    after the kernels, where a zero fill would write the whole buffer
    before them."""
    P, T, R = prod(shape[:axis]), shape[axis], prod(shape[axis + 1 :])
    BT = 64
    BR = min(max(16, next_power_of_2(R)), max(16, 8192 // BT))
    return LaunchPlan(
        kernel=zero_uncovered_kernel,
        grid=(cdiv(T, BT), P),
        params=(
            In(name),
            In("cu_seqlens"),
            In("chunk_offsets" if chunk else "cu_seqlens"),
            n_seq,
            T,
            n_slots,
        ),
        outputs=(OutputSpec(tuple(shape), dtype),),
        output_names=(name,),
        constexprs=dict(R=R, BT=BT, BR=BR, BN=32, CHUNK=chunk),
        num_warps=4,
        num_stages=1,
        aliases=((0, name),),
    )


@jit(sizes=("N", "T", "NSORT"))
def sequence_order_kernel(cu_seqlens, N, T, NSORT, order, CHUNK: tl.constexpr, BI: tl.constexpr,
                          BJ: tl.constexpr):  # fmt: skip
    """``order [N]`` int32: the sequences by decreasing count of
    ``CHUNK``-token chunks (as :func:`sequence_bounds` clamps them), ties
    in index order; ``0 .. N-1`` when ``NSORT`` is 0 (else ``NSORT == N``).

    Program ``p`` ranks sequences ``[p*BI, (p+1)*BI)`` against all ``N``,
    ``BJ`` at a time (``N^2`` comparisons in all), and writes each index
    at its rank.  The ranks are a permutation of ``[0, N)`` whatever
    ``cu_seqlens`` holds (a strict total order), so every entry is written
    once and every store stays inside ``order``."""
    i = tl.program_id(0) * BI + tl.arange(0, BI)
    m_i = i < N
    n_i = block_chunks(cu_seqlens, i, m_i, T, CHUNK)
    rank = tl.zeros([BI], dtype=tl.int32)
    for j0 in range(0, NSORT, BJ):
        j = j0 + tl.arange(0, BJ)
        m_j = j < NSORT
        n_j = block_chunks(cu_seqlens, j, m_j, T, CHUNK)
        ahead = (n_j[None, :] > n_i[:, None]) | ((n_j[None, :] == n_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & m_j[None, :]).to(tl.int32), axis=1)
    rank = tl.where(NSORT > 0, rank, i)
    tl.store(order + rank, i, mask=m_i)


# Sequences a launch of sequence_order_kernel sorts; beyond, it writes 0 ..
# N-1.  The order matters where a walk launch is a few waves of programs
# (16 documents x 32 heads x 2 value tiles on 132 SMs: 8); a thousand
# sequences make hundreds of waves, whose last is short in any order,
# while the ranks' N^2 comparisons (N / 64 programs of N / 64 steps) grow.
SORT_LIMIT = 1024


@functools.lru_cache(maxsize=256)
def sequence_order_plan(
    n_seq: int, seq_len: int, chunk: int, output_name: str, sort: bool = True
) -> LaunchPlan:
    """The launch that orders the ``n_seq`` sequences of input
    ``cu_seqlens`` longest first (:func:`sequence_order_kernel`), for
    kernels that give each sequence a program and walk its chunks in turn:
    their programs then start longest first, so that the GPU's last wave
    is made of short walks (greedy scheduling's longest-first rule).
    ``sort=False``: index order."""
    BI = 64
    return LaunchPlan(
        kernel=sequence_order_kernel,
        grid=(cdiv(n_seq, BI),),
        params=(In("cu_seqlens"), n_seq, seq_len, n_seq if sort and n_seq <= SORT_LIMIT else 0),
        outputs=(OutputSpec((max(n_seq, 1),), "int32"),),
        output_names=(output_name,),
        constexprs=dict(CHUNK=chunk, BI=BI, BJ=64),
        num_warps=4,
        num_stages=1,
    )
