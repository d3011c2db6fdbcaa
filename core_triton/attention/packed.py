"""Packed variable-length softmax attention: ``cu_seqlens`` (and
``cu_seqlens_k``) as the segment ids and positions the flash kernels read.

Packed input has batch 1; sequence ``i`` holds queries ``[cu_q[i],
cu_q[i+1])`` and keys ``[cu_k[i], cu_k[i+1])`` (``cu_k = cu_q`` when no
``cu_seqlens_k`` is given).  Within sequence ``i`` query ``t`` has position
``len_k(i) - len_q(i) + t`` and key ``s`` position ``s``, so a causal mask
is aligned at the sequences' ends (as in flash-attn's varlen call), and a
sliding window counts from there.

One small launch per side turns the boundaries into ``[1, T]`` int32
segment ids (the sequence index) and positions; the flash kernels then
skip every key block that holds no key of a query block's sequences.
Boundaries are read on the device only (they may be traced) and clamped as
core_triton.common.sequences says: whatever they hold, every access stays
inside the tensors.  A token no sequence covers gets segment ``-1``
(query) or ``-2`` (key): it matches nothing, so its output is 0 and its
``lse`` is ``-inf`` (with sinks: the sinks' share).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from core_triton.attention import segment_ranges
from core_triton.common.checks import check_cu_seqlens, check_same_device
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import jit
from core_triton.common.sequences import find_sequence

_BLOCK = 1024


@triton.jit
def _bounds(cu, n, ok, T):
    """Sequence ``n``'s rows ``[bos, eos)`` clamped into ``[0, T]``
    (core_triton.common.sequences); nothing is read where ``ok`` is False."""
    bos = tl.load(cu + n, mask=ok, other=0).to(tl.int64)
    eos = tl.load(cu + n + 1, mask=ok, other=0).to(tl.int64)
    bos = tl.minimum(tl.maximum(bos, 0), T)
    eos = tl.minimum(tl.maximum(eos, bos), T)
    return bos, eos


@triton.jit
def _descents(cu, N, BLOCK: tl.constexpr):
    """How many times ``cu[0 .. N]`` decreases from one entry to the next."""
    count = 0
    for c in range(0, N, BLOCK):
        i = c + tl.arange(0, BLOCK)
        pair = i < N
        a = tl.load(cu + i, mask=pair, other=0).to(tl.int64)
        b = tl.load(cu + i + 1, mask=pair, other=0).to(tl.int64)
        count += tl.sum((pair & (a > b)).to(tl.int32), 0)
    return count


@jit(sizes=("N", "n_iter", "TQ", "TK"))
def packed_ids_kernel(
    cu_q, cu_k, N, n_iter, TQ, TK, seg, pos, other, QUERY: tl.constexpr, BLOCK: tl.constexpr
):
    """``seg [T]``, ``pos [T]`` and ``other [2T]`` int32 of the query side
    (``QUERY``, ``T = TQ``) or the key side (``T = TK``): each token's
    sequence and position (module docstring), and the index range
    ``[other[t], other[T + t])`` of the other side's tokens of its sequence
    (empty for an uncovered token; the format of
    core_triton.attention.segment_ranges).  ``N`` may be 0 (no sequence: every
    token uncovered)."""
    t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if QUERY:
        T = TQ
        own = cu_q
    else:
        T = TK
        own = cu_k
    m = t < T
    ok = m & ((t * 0 + N) > 0)
    # The sequence whose (raw) start is the last at or before t, in
    # [0, max(N, 1)); its clamped bounds decide whether it covers t.
    n = find_sequence(own, t, N, n_iter)
    bq, eq = _bounds(cu_q, n, ok, TQ)
    bk, ek = _bounds(cu_k, n, ok, TK)
    if QUERY:
        inside = ok & (t >= bq) & (t < eq)
        p = (ek - bk) - (eq - bq) + (t - bq)
        s = tl.where(inside, n, -1)
        lo, hi = bk, ek
    else:
        inside = ok & (t >= bk) & (t < ek)
        p = t - bk
        s = tl.where(inside, n, -2)
        lo, hi = bq, eq
    # The range is exact (core_triton.attention.segment_ranges) when both
    # boundary arrays never decrease; else it only bounds the sequence's
    # tokens (clamped boundaries of a decreasing array may overlap), and its
    # start is stored as -1 - start.
    descents = _descents(cu_q, N, BLOCK) + _descents(cu_k, N, BLOCK)
    lo = tl.where(inside, lo, 0)
    lo = tl.where(descents == 0, lo, -1 - lo)
    tl.store(seg + t, s.to(tl.int32), mask=m)
    tl.store(pos + t, tl.where(inside, p, 0).to(tl.int32), mask=m)
    tl.store(other + t, lo.to(tl.int32), mask=m)
    tl.store(other + T + t, tl.where(inside, hi, 0).to(tl.int32), mask=m)


def _n_iter(n: int) -> int:
    return max(1, n.bit_length() + 1)


@functools.lru_cache(maxsize=256)
def packed_plans(n_seq: int, query_len: int, key_len: int) -> tuple[LaunchPlan, LaunchPlan]:
    """The two launches (query side, key side) that turn inputs ``cu_q`` and
    ``cu_k`` (``[n_seq + 1]``, int32 or int64) into ``q_segment_ids``, ``q_positions``
    ``[1, query_len]`` and ``kv_segment_ids``, ``kv_positions`` ``[1,
    key_len]``, all int32."""
    plans = []
    for query, T, names in (
        (True, query_len, ("q_segment_ids", "q_positions", "q_key_range")),
        (False, key_len, ("kv_segment_ids", "kv_positions", "kv_query_range")),
    ):
        plans.append(
            LaunchPlan(
                kernel=packed_ids_kernel,
                grid=(triton.cdiv(max(T, 1), _BLOCK),),
                params=(In("cu_q"), In("cu_k"), n_seq, _n_iter(n_seq), query_len, key_len),
                outputs=(
                    OutputSpec((1, T), "int32"),
                    OutputSpec((1, T), "int32"),
                    OutputSpec((1, 2 * T), "int32"),
                ),
                output_names=names,
                constexprs=dict(QUERY=query, BLOCK=_BLOCK),
                num_warps=4,
                num_stages=1,
            )
        )
    return tuple(plans)


def prepare(
    query: TensorInfo,
    key: TensorInfo,
    cu_seqlens: TensorInfo | None,
    cu_seqlens_k: TensorInfo | None,
    index: dict[str, TensorInfo | None],
) -> tuple[dict[str, TensorInfo | None], tuple[LaunchPlan, ...]]:
    """What ``flash_attention`` plans with for this call: ``(index,
    launches)``.  Unpacked calls (no ``cu_seqlens``) get ``index`` (the
    segment ids' and positions' infos) back, with segment ids the infos of
    their ranges and the launch that makes them from the ids (inputs by the
    ids' names; core_triton.attention.segment_ranges), else no launch.  Packed calls
    are checked (they take no segment ids or positions) and get the infos of
    the arrays the attention then reads, by name (segment ids, positions
    only when the keys have their own boundaries, ``q_key_range``,
    ``kv_query_range``), and the launches that make them from inputs
    ``cu_q`` and ``cu_k``; each launch makes every output it names, the
    binding keeps those ``index`` names."""
    if cu_seqlens is None:
        if cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_k needs cu_seqlens (the queries' boundaries)")
        return _segment_ranges(index)
    n_seq = check_cu_seqlens(cu_seqlens, query.shape[0])
    check_cu_seqlens(cu_seqlens_k, key.shape[0], "cu_seqlens_k")
    # Before the boundaries' launches (which would otherwise meet a host
    # array beside device data inside Triton).
    check_same_device({"query": query, "key": key, "cu_seqlens": cu_seqlens, "cu_seqlens_k": cu_seqlens_k})
    if cu_seqlens_k is not None and cu_seqlens_k.shape != cu_seqlens.shape:
        raise ValueError(
            f"cu_seqlens_k must have the shape of cu_seqlens {list(cu_seqlens.shape)}, "
            f"got {list(cu_seqlens_k.shape)}"
        )
    if cu_seqlens_k is None and key.shape[1] != query.shape[1]:
        raise ValueError(
            f"without cu_seqlens_k the keys share the queries' boundaries: key length {key.shape[1]} "
            f"must equal query length {query.shape[1]}"
        )
    for name, t in index.items():
        if t is not None:
            raise ValueError(f"{name} cannot be combined with cu_seqlens (packing sets segments, positions)")
    Tq, Tk = query.shape[1], key.shape[1]
    return _infos(Tq, Tk, query.device, cu_seqlens_k is not None), packed_plans(n_seq, Tq, Tk)


def _segment_ranges(index: dict[str, TensorInfo | None]) -> tuple[dict[str, TensorInfo | None], tuple]:
    """Segment ids (one array for both sides, or one each): ``index`` with
    the infos of the key and query ranges the flash kernels skip tiles by,
    and the launch that makes them (core_triton.attention.segment_ranges).
    Ids of the wrong shape get no launch: the attention's checks name them."""
    q_seg, kv_seg = index.get("q_segment_ids"), index.get("kv_segment_ids")
    if q_seg is None and kv_seg is None:
        return index, ()
    q_name = "q_segment_ids" if q_seg is not None else "kv_segment_ids"
    kv_name = "kv_segment_ids" if kv_seg is not None else "q_segment_ids"
    q_seg, kv_seg = index[q_name], index[kv_name]
    if q_seg.ndim != 2 or kv_seg.ndim != 2 or q_seg.shape[0] != kv_seg.shape[0]:
        return index, ()
    ranges = segment_ranges.range_infos(q_seg.shape[0], q_seg.shape[1], kv_seg.shape[1], q_seg.device)
    return {**index, **ranges}, (segment_ranges.range_plan(q_seg, kv_seg, q_name, kv_name),)


def _infos(query_len: int, key_len: int, device: str | None, own_keys: bool) -> dict[str, TensorInfo | None]:
    """The TensorInfos of the arrays :func:`packed_plans` makes that the
    attention reads.  ``own_keys`` (``cu_seqlens_k`` given): explicit
    positions; else the queries and keys share their boundaries, so
    positions within a sequence differ as the packed indices do and the
    default positions (which let causal attention skip whole key blocks)
    give the same mask."""
    q = TensorInfo((1, query_len), "int32", (query_len, 1), device)
    k = TensorInfo((1, key_len), "int32", (key_len, 1), device)
    return {
        "q_segment_ids": q,
        "kv_segment_ids": k,
        "q_positions": q if own_keys else None,
        "kv_positions": k if own_keys else None,
        "q_key_range": TensorInfo((1, 2 * query_len), "int32", (2 * query_len, 1), device),
        "kv_query_range": TensorInfo((1, 2 * key_len), "int32", (2 * key_len, 1), device),
    }
