"""The chunk state passes split over the sequence, for batch 1 and long
sequences (how packed training runs).

A whole-sequence state pass has one program per (K tile, V tile, sequence
x head): at batch 1 with 16 heads that is 64 programs on the H100's 132
SMs, each stepping through hundreds of chunks one after another.  The
chunk-to-chunk recurrence is linear with a scalar decay,

    S_{c+1} = exp(b_tot(c)) S_c + U_c,

so a run of chunks (a *segment*) maps the state entering it to
``exp(sum b_tot) S + Delta``, with ``Delta`` what the segment leaves from a
zero start.  Three launches replace the walk:

1. every segment from zero, in parallel: ``Delta`` and the summed log
   decay (``chunk_fwd_state_segment_kernel`` with ``STORE_H`` False);
2. :func:`state_split_carry_kernel`, one program per (tile, sequence x head):
   the state entering each segment, from the initial state, segment after
   segment (a short walk: a few dozen segments), and the final state;
3. every segment again from its carried start, in parallel, storing the
   state entering each chunk (``STORE_H``); with float32 chunk states the
   forward computes the output there instead
   (chunk_fwd_output.chunk_fwd_output_segment_kernel, no chunk state in
   memory) and the backward stores the states.  A forward no gradient
   follows has no use for the segments' start states beyond that output:
   its output pass carries the segments itself (each program sums the
   deltas before its own; ``CARRY``), step 2 is not launched, and step 1
   skips each sequence's last segment visited (``SKIP_LAST``).  Where
   the backward's gradient walks apply (chunk.py), neither direction
   stores the chunk states: both walk the segments from their carried
   starts with the states in registers.

The backward's gradient pass is the same recurrence walked the other way
(chunk_bwd_state.py), with the final state's cotangent as its start.

Segments are ``S`` chunks of one sequence from its first chunk (the last
may be shorter); packed input places them by chunk slot
(core_triton.common.sequences.sequence_segments).  :func:`segment_chunks` picks
``S`` from the plan: a split only where the whole-sequence walk leaves the
GPU mostly idle.
"""

import contextlib

import triton
import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_chunks, sequence_segments
from core_triton.common.utils import cdiv

# When to split and how finely, measured on the H100 (bf16, H16, K = V =
# 128, chunk g and lightning, docs/benchmarks.md "long context"): at batch
# 1 (64 programs) the split took the chunk-g forward from 1.74 to 1.32 ms
# at T32k and from 6.86 to 5.00 ms at T128k; at batch 4 (256 programs) it
# made it slower (0.50 -> 0.68 ms at T4k), as it did 16 packed documents
# (1.18 -> 1.60 ms: their own 1024 programs already fill the GPU).  Segments
# of 32 to 64 chunks did best at every length (16 and 228 were slower).
SPLIT_BELOW_PROGRAMS_PER_SM = 0.5  # split only below this many programs per SM
PROGRAMS_PER_SM = 16  # the split aims for this many
MIN_SEGMENT_CHUNKS = 32

# A forward that no gradient follows, with float32 chunk states (the
# output then comes from the segments' start states, no chunk state in
# memory): segments of the largest of these lengths that leaves at least two
# per sequence.  H100, chunk g, bf16, H16, K = V = 128, forward ms (whole
# walk -> split): B4 T4k 0.423 -> 0.295 (segments of 32; 16: 0.313, 64:
# 0.459); B1 T32k in 16 documents 0.960 -> 0.773 (16; 32: 0.826); T128k in
# 16 documents 3.659 -> 2.647 (32; 64: 2.704); one sequence of 32k 0.608
# (32, the training split) -> 0.563 (64).  A training call keeps
# segment_chunks's choice: its backward walks the same segments, and split
# there it cost more than the forward saved (B4 T4k forward+backward 1.445
# whole, 1.646 split in 32).
FORWARD_ONLY_SEGMENTS = (64, 32, 16)
# Longer segments for that forward at one sequence, where they still give
# its output pass a wave of programs (within 5%): each program carries the
# state over every segment of its sequence before its own (CARRY: a loop
# of dependent loads that grows with the segment count).  Measured at
# K = 128 (H100, bf16, H16, forward ms, segments of 64 -> these:
# docs/benchmarks.md, "Twenty-ninth session"), where the output pass holds
# two programs an SM; a smaller state holds more, and the rule would leave
# SMs idle.
LONG_SEGMENTS = (256, 128)
LONG_SEGMENTS_MIN_K = 128
OUTPUT_PROGRAMS_PER_SM = 2
WAVE_FILL = 0.95

# Half-precision chunk states (lightning: half inputs, no per-token gate)
# take that forward too (True), or the training call's (False): their
# training forward stores half the bytes.  H100, lightning bf16 H16 K = V =
# 128, forward ms (training forward -> this one): B1 T32k 0.693 -> 0.528,
# T128k 2.58 -> 1.91, T128k in 16 documents 2.292 -> 2.140, B4 T4k 0.282
# -> 0.267.  T32k in 16 documents (segments of 16) lost at first (0.595 ->
# 0.630) and gains since the passes accumulate their half-precision
# products in place with three-stage state passes (0.579 -> 0.546).
FORWARD_ONLY_HALF_STATES = True

# Where a training call splits and the gradient walks apply (no gradient of
# a gate to form, one query head per state head: chunk.py), its backward
# computes dq, dk and dv by walking the segments with the chunk states in
# registers, and its forward is the segment output pass in the segments a
# forward alone takes (True); else the backward stores every chunk's h and
# dh for chunk_dv and chunk_dqk (False).
GRADIENT_WALKS = True

# Tests and benchmarks force a segment length: {"segment_chunks": S}, with
# S = 0 for the whole-sequence walk, {"fused_output": 0} the forward that
# stores the chunk states, {"gradient_walks": 0 or 1} GRADIENT_WALKS and
# {"alone_as_trained": 1} no forward of its own for a call that no gradient
# follows (set them through forced_segments, which also drops the plans
# made before).
SPLIT_OVERRIDE: dict[str, int] = {}


def long_segment_chunks(chunks: int, sequences: int, programs: int, sms: int, k: int) -> int:
    """For one sequence (``sequences == 1``, batched or packed) of ``chunks``
    chunks and states of ``k >= LONG_SEGMENTS_MIN_K`` rows: the longest of
    ``LONG_SEGMENTS`` that makes at least two segments and, at ``programs``
    output-pass programs a segment, a wave of them on ``sms`` SMs; 0: none
    (:func:`forward_only_segment_chunks` then: several sequences were not
    measured)."""
    if "segment_chunks" in SPLIT_OVERRIDE:
        return int(SPLIT_OVERRIDE["segment_chunks"])
    if sequences != 1 or k < LONG_SEGMENTS_MIN_K:
        return 0
    wave = WAVE_FILL * OUTPUT_PROGRAMS_PER_SM * sms
    return next((s for s in LONG_SEGMENTS if 2 * s <= chunks and cdiv(chunks, s) * programs >= wave), 0)


@contextlib.contextmanager
def forced_segments(
    segment_chunks: int | None,
    fused_output: bool = True,
    forward_only: bool = True,
    gradient_walks: bool | None = None,
):
    """Plan the chunk ops (chunk_linear_attn, lightning) inside the block
    with segments of ``segment_chunks`` chunks (0: the whole-sequence walk;
    None: the plan's own choice); ``fused_output`` False makes a split
    forward with float32 chunk states store them for the output kernel, as
    it does where the segment output pass's tiles fit in no shared memory;
    ``forward_only`` False gives a call that no gradient follows the
    training call's forward (``OpPlans.inference`` left empty);
    ``gradient_walks`` sets GRADIENT_WALKS (None: as it is).  The chunk
    plans cached before and inside are dropped, so no plan outlives the
    setting it was made under."""
    from core_triton.linear_attn import chunk  # it imports this module

    before = dict(SPLIT_OVERRIDE)
    for key in ("segment_chunks", "fused_output", "gradient_walks", "alone_as_trained"):
        SPLIT_OVERRIDE.pop(key, None)
    if not forward_only:
        SPLIT_OVERRIDE["alone_as_trained"] = 1
    if gradient_walks is not None:
        SPLIT_OVERRIDE["gradient_walks"] = int(gradient_walks)
    if segment_chunks is not None:
        SPLIT_OVERRIDE["segment_chunks"] = segment_chunks
    if not fused_output:
        SPLIT_OVERRIDE["fused_output"] = 0
    chunk._make_plans.cache_clear()
    try:
        yield
    finally:
        SPLIT_OVERRIDE.clear()
        SPLIT_OVERRIDE.update(before)
        chunk._make_plans.cache_clear()


def segment_chunks(sequences: int, heads: int, tiles: int, chunks: int, sms: int) -> int:
    """Chunks per segment for a state pass over ``sequences`` sequences
    (batch rows, or packed input's sequences), ``heads`` state heads and
    ``tiles`` K x V tiles, with ``chunks`` chunks per batch row, on a GPU
    of ``sms`` SMs; 0: no split.

    Split where the whole-sequence walk has at most
    ``SPLIT_BELOW_PROGRAMS_PER_SM`` programs per SM, into segments that
    bring it to ``PROGRAMS_PER_SM``, never shorter than
    ``MIN_SEGMENT_CHUNKS``, and only when that makes at least two segments.
    Packed sequences count as if of equal length (their lengths are not
    known here): documents of similar length fill the GPU by themselves,
    and one long document among short ones walks alone."""
    if "segment_chunks" in SPLIT_OVERRIDE:
        return int(SPLIT_OVERRIDE["segment_chunks"])
    programs = sequences * heads * tiles
    if chunks == 0 or programs > SPLIT_BELOW_PROGRAMS_PER_SM * sms:
        return 0
    segments = cdiv(PROGRAMS_PER_SM * sms, programs)
    size = max(MIN_SEGMENT_CHUNKS, cdiv(chunks, segments))
    return size if size < chunks else 0


def forward_only_segment_chunks(chunks: int) -> int:
    """Chunks per segment for a forward that no gradient follows, over
    sequences of ``chunks`` chunks (packed input: on average); 0: no split.
    The longest of ``FORWARD_ONLY_SEGMENTS`` that makes at least two
    segments (unlike :func:`segment_chunks` this splits at any batch: what
    it saves is the chunk states' trip through memory, which every batch
    pays, besides the idle SMs of a small one)."""
    if "segment_chunks" in SPLIT_OVERRIDE:
        return int(SPLIT_OVERRIDE["segment_chunks"])
    return next((s for s in FORWARD_ONLY_SEGMENTS if 2 * s <= chunks), 0)


@triton.jit
def start_tile(start, state_row, off_kv, m_kv, BK: tl.constexpr, BV: tl.constexpr, USE_START: tl.constexpr):
    """A ``[BK, BV]`` float32 tile of the state ``start`` at ``state_row``
    (offsets ``off_kv``, mask ``m_kv``), or zeros without ``USE_START``."""
    x = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_START:
        x += tl.load(start + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)
    return x


@triton.jit
def carry_segments(
    x,
    seg_delta,
    seg_decay,
    seg_start,
    g0,
    n_seg,
    steps,
    i_h,
    off_kv,
    m_kv,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    LAST_FIRST: tl.constexpr,
    STORE: tl.constexpr,
):
    """Carry the tile ``x`` over the first ``steps`` of a sequence's
    ``n_seg`` segments (slots from ``g0``) in visiting order, first to last
    or, with ``LAST_FIRST``, last to first:

        seg_start[g] = X (with ``STORE``);   X = exp(seg_decay[g]) X + seg_delta[g]

    and return ``X``."""
    for it in range(0, steps.to(tl.int32)):
        if LAST_FIRST:
            g = g0 + n_seg - 1 - it
        else:
            g = g0 + it
        row = (g * H + i_h) * K * V
        if STORE:
            tl.store(seg_start + row + off_kv, x, mask=m_kv)
        decay = tl.exp(tl.load(seg_decay + g * H + i_h))
        x = x * decay + tl.load(seg_delta + row + off_kv, mask=m_kv, other=0)
    return x


@jit(sizes=("T", "NT", "NS", "NG", "S"))
def state_split_carry_kernel(
    start,
    seg_delta,
    seg_decay,
    cu_seqlens,
    chunk_offsets,
    T,
    NT,
    NS,
    NG,
    S,
    seg_start,
    final,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_START: tl.constexpr,
    LAST_FIRST: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """One program per (K tile, V tile, sequence x head): carries ``start
    [N, H, K, V]`` (zero without ``USE_START``) over the sequence's
    segments, first to last or, with ``LAST_FIRST``, last to first:

        seg_start[g] = X;   X = exp(seg_decay[g]) X + seg_delta[g]

    then ``final [N, H, K, V] = X``.  ``seg_delta``/``seg_start``
    ``[segments, H, K, V]`` and ``seg_decay [segments, H]`` are float32."""
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_nh = tl.program_id(2)
    i_n = i_nh // H
    i_h = i_nh % H
    _, _, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)
    g0, n_seg = sequence_segments(i_n, slot0, n_chunks, NT, NG, S, IS_VARLEN)

    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    state_row = (i_n.to(tl.int64) * H + i_h) * K * V

    x = start_tile(start, state_row, off_kv, m_kv, BK, BV, USE_START)
    x = carry_segments(x, seg_delta, seg_decay, seg_start, g0, n_seg, n_seg, i_h, off_kv, m_kv, H, K, V,
                       LAST_FIRST, True)  # fmt: skip
    tl.store(final + state_row + off_kv, x.to(final.dtype.element_ty), mask=m_kv)
