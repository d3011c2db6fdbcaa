"""Segment ids as key and query ranges: what lets the flash kernels skip the
tiles two segments never share (and the per-element comparison inside the
tiles one segment fills).

For each query token one launch writes the index range ``[lo, hi)`` of the
keys of its segment, and for each key token the range of the queries of its
segment, in the format the flash kernels read (``RANGE [B, 2T]`` int32: the
starts in ``[:, :T]``, the ends in ``[:, T:]``; the packed input of
core_triton.attention.packed writes the same format):

* **exact** (``lo >= 0``): every token of the other side in ``[lo, hi)`` has
  this token's segment, and none outside it does.  That holds when the other
  side's ids of this batch row never decrease along the sequence (packed
  documents, padding at either end): the range is then found by two binary
  searches, or, for a program whose tokens share one id, by counting the
  other side's ids below it and up to it in the scan.  An empty range
  (``lo == hi``) is a segment the other side does not have.
* **a bound only** (``lo`` stored as ``-1 - lo``): every token of the segment
  lies in ``[lo, hi)``, others may too.  Where the other side's row is
  unsorted, the tokens of one program (``_BLOCK`` consecutive ones) share
  the span from the first to the last token of the other side whose id lies
  between their smallest and largest ids (empty when none does); the
  kernels mask every tile of such a range (no per-tile test: a loop with a
  branch in it is not pipelined, and a compiled kernel that has one
  serialises its matrix products everywhere).

The contract gives no id a special meaning, so whether a row is sorted is
found on the device (a scan of the other side's row in every program: no
host sync, and the ids may be traced).  Ids are compared as int32, as the
flash kernels compare them.  Every load and store stays inside the ids and
the outputs whatever they hold.
"""

from __future__ import annotations

import functools
import itertools

import triton
import triton.language as tl

from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import jit

# Tokens per program: an unsorted row's bound is shared by a program's
# tokens, so no wider than the flash kernels' largest block (128) to stay
# tight.  SCAN: the stretch of the other row each step of the scan reads,
# over _WARPS warps.  Measured on the H200 (bench.probes.ranges_scan, B1,
# us; the scan reduced every step, 4096 over 4 warps, before): T16k 14.8
# -> 8.8 (sorted), 18.4 -> 14.2 (shuffled); T4k one segment 3.8 -> 3.5,
# 64 documents 6.2 -> 7.0 (8 warps slow the search those blocks run:
# 4096 over 8 warps with the old scan took 6.5 there, 10.7 at 16k).
_BLOCK = 128
_SCAN = 1024
_WARPS = 8
# Points each step of the search probes, plus one: the search's dependent
# loads are what a short call waits for.
_WAYS = 16


@triton.jit
def _bounds(OTHER, s, valid, T_other, n_iter, WAYS: tl.constexpr):
    """``(first, last)``: the first index of the other row (length
    ``T_other``, read as sorted) whose id is ``>= s``, and the first whose
    id is ``> s``, for each lane.  A ``WAYS``-ary search: each step probes
    ``WAYS - 1`` points of the interval left (the two searches side by
    side), so ``n_iter`` (:func:`_search_steps`) steps of dependent loads
    reach one index where halving would take ``log2(T_other)``.  Loads only
    inside ``[0, T_other)``."""
    i = tl.arange(0, WAYS)[None, :]
    probe = i < WAYS - 1
    lo = tl.zeros_like(s)
    hi = tl.zeros_like(s) + T_other
    lo2 = tl.zeros_like(s)
    hi2 = tl.zeros_like(s) + T_other
    for _ in range(n_iter):
        p = lo[:, None] + ((i + 1) * (hi - lo)[:, None]) // WAYS
        p2 = lo2[:, None] + ((i + 1) * (hi2 - lo2)[:, None]) // WAYS
        m = valid[:, None] & probe & (p < hi[:, None])
        m2 = valid[:, None] & probe & (p2 < hi2[:, None])
        x = tl.load(OTHER + p, mask=m, other=0).to(tl.int32)
        x2 = tl.load(OTHER + p2, mask=m2, other=0).to(tl.int32)
        below = x < s[:, None]
        below2 = x2 <= s[:, None]
        lo = tl.maximum(lo, tl.max(tl.where(m & below, p + 1, 0), 1))
        hi = tl.minimum(hi, tl.min(tl.where(m & ~below, p, T_other), 1))
        lo2 = tl.maximum(lo2, tl.max(tl.where(m2 & below2, p2 + 1, 0), 1))
        hi2 = tl.minimum(hi2, tl.min(tl.where(m2 & ~below2, p2, T_other), 1))
    return lo, lo2


@triton.jit
def _side_ranges(
    OWN,
    OTHER,
    OUT,
    T_own,
    T_other,
    n_iter,
    start,
    BLOCK: tl.constexpr,
    SCAN: tl.constexpr,
    WAYS: tl.constexpr,
):
    """Ranges of the tokens ``start .. start + BLOCK - 1`` of one side's row
    ``OWN`` into the other side's row ``OTHER``, stored at ``OUT`` (this
    row's ``[2 T_own]``)."""
    t = start + tl.arange(0, BLOCK)
    valid = t < T_own
    s = tl.load(OWN + t, mask=valid, other=0).to(tl.int32)
    smin = tl.min(tl.where(valid, s, 2147483647), 0)
    smax = tl.max(tl.where(valid, s, -2147483648), 0)
    # One pass over the other row (every program reads it whole: one launch,
    # no second pass, and ids are small next to the attention's inputs):
    # does it ever decrease, and where are its tokens whose id lies in this
    # block's [smin, smax] (the bound an unsorted row gets)?  Also the
    # tokens of the other row below smin and up to smax: where this block
    # holds one id (smin == smax) and the row is sorted, its range in
    # searchsorted's terms, with no search.  Each lane keeps its own tally
    # across the pass and they are reduced once after it: a reduction a
    # step (five of them, each through shared memory) made the pass a chain
    # of waits.
    descents = tl.zeros([SCAN], tl.int32)
    first_hit = tl.zeros([SCAN], tl.int32) + T_other
    last_hit = tl.zeros([SCAN], tl.int32) - 1
    n_below = tl.zeros([SCAN], tl.int32)
    n_upto = tl.zeros([SCAN], tl.int32)
    for c in range(0, T_other, SCAN):
        j = c + tl.arange(0, SCAN)
        inside = j < T_other
        pair = j + 1 < T_other
        x = tl.load(OTHER + j, mask=inside, other=0).to(tl.int32)
        y = tl.load(OTHER + j + 1, mask=pair, other=0).to(tl.int32)
        descents += (pair & (x > y)).to(tl.int32)
        hit = inside & (x >= smin) & (x <= smax)
        first_hit = tl.minimum(first_hit, tl.where(hit, j, T_other))
        last_hit = tl.maximum(last_hit, tl.where(hit, j, -1))
        n_below += (inside & (x < smin)).to(tl.int32)
        n_upto += (inside & (x <= smax)).to(tl.int32)
    descents = tl.sum(descents, 0)
    first_hit = tl.min(first_hit, 0)
    last_hit = tl.max(last_hit, 0)
    n_below = tl.sum(n_below, 0)
    n_upto = tl.sum(n_upto, 0)
    if smin == smax:
        # One id in the block (one segment, or a document longer than the
        # block: most blocks): its first index and one past its last, were
        # the row sorted, are the counts (the search's dependent loads are
        # most of a short call's time).
        first = tl.zeros_like(s) + n_below
        last = tl.zeros_like(s) + n_upto
    else:
        first, last = _bounds(OTHER, s, valid, T_other, n_iter, WAYS)
    sorted_ = descents == 0
    # A bound: [first_hit, last_hit + 1), or empty ([0, 0)) without a hit.
    b_lo = tl.where(last_hit >= 0, first_hit, 0)
    b_hi = last_hit + 1
    lo = tl.where(sorted_, first, -1 - b_lo)
    hi = tl.where(sorted_, last, b_hi)
    tl.store(OUT + t, lo, mask=valid)
    tl.store(OUT + T_own + t, hi, mask=valid)


@jit(sizes=("stride_qb", "stride_kb", "Tq", "Tk", "q_iter", "k_iter"))
def segment_ranges_kernel(
    QSEG,
    KSEG,
    stride_qb,
    stride_kb,
    Tq,
    Tk,
    q_iter,
    k_iter,
    Q_KEY_RANGE,
    KV_QUERY_RANGE,
    BLOCK: tl.constexpr,
    SCAN: tl.constexpr,
    WAYS: tl.constexpr,
):
    """Grid ``(cdiv(max(Tq, Tk), BLOCK), B, 2)``: axis 2 picks the side,
    0 the queries' key ranges ``Q_KEY_RANGE [B, 2Tq]``, 1 the keys' query
    ranges ``KV_QUERY_RANGE [B, 2Tk]`` (module docstring).  ``QSEG [B,
    Tq]``, ``KSEG [B, Tk]`` int32/int64 (unit stride along time; the same
    array for both sides when one gives both); ``q_iter``/``k_iter``: the
    steps a search over ``Tq``/``Tk`` ids needs (:func:`_search_steps`)."""
    start = tl.program_id(0) * BLOCK
    b = tl.program_id(1).to(tl.int64)
    QSEG_b = QSEG + b * stride_qb
    KSEG_b = KSEG + b * stride_kb
    # Each side is its own call (the two rows may differ in dtype).
    if tl.program_id(2) == 0:
        if start < Tq:
            _side_ranges(QSEG_b, KSEG_b, Q_KEY_RANGE + b * 2 * Tq, Tq, Tk, k_iter, start, BLOCK, SCAN, WAYS)
    else:
        if start < Tk:
            _side_ranges(
                KSEG_b, QSEG_b, KV_QUERY_RANGE + b * 2 * Tk, Tk, Tq, q_iter, start, BLOCK, SCAN, WAYS
            )


def _search_steps(n: int, ways: int = _WAYS) -> int:
    """Steps of :func:`_bounds` over ``n`` entries: the widest interval a
    step can leave, followed until none is left."""
    steps = 0
    while n > 0:
        cuts = [(i + 1) * n // ways for i in range(ways - 1)]
        n = max([cuts[0]] + [b - a - 1 for a, b in itertools.pairwise(cuts)] + [n - cuts[-1] - 1])
        steps += 1
    return max(steps, 1)


def range_infos(batch: int, query_len: int, key_len: int, device: str | None) -> dict[str, TensorInfo]:
    """The TensorInfos of ``q_key_range [B, 2Tq]`` and ``kv_query_range
    [B, 2Tk]`` (int32, contiguous)."""
    return {
        "q_key_range": TensorInfo((batch, 2 * query_len), "int32", (2 * query_len, 1), device),
        "kv_query_range": TensorInfo((batch, 2 * key_len), "int32", (2 * key_len, 1), device),
    }


@functools.lru_cache(maxsize=256)
def range_plan(q_seg: TensorInfo, kv_seg: TensorInfo, q_name: str, kv_name: str) -> LaunchPlan:
    """The launch that makes ``q_key_range`` and ``kv_query_range`` from the
    segment ids named ``q_name`` (``[B, Tq]``) and ``kv_name`` (``[B,
    Tk]``), each read with unit stride along time (the same input twice
    when one array serves both sides)."""
    B, Tq = q_seg.shape
    Tk = kv_seg.shape[1]
    infos = range_infos(B, Tq, Tk, q_seg.device)
    return LaunchPlan(
        kernel=segment_ranges_kernel,
        grid=(triton.cdiv(max(Tq, Tk, 1), _BLOCK), B, 2),
        params=(
            In(q_name),
            In(kv_name),
            q_seg.strides[0] if B > 1 else 0,
            kv_seg.strides[0] if B > 1 else 0,
            Tq,
            Tk,
            _search_steps(Tq),
            _search_steps(Tk),
        ),
        outputs=tuple(OutputSpec(info.shape, "int32") for info in infos.values()),
        output_names=tuple(infos),
        constexprs=dict(BLOCK=_BLOCK, SCAN=_SCAN, WAYS=_WAYS),
        num_warps=_WARPS,
        num_stages=1,
    )
