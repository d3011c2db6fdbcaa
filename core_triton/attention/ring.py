"""Planning for ``ring_attention`` (the framework-free part of the ring).

Each of ``n`` devices holds one shard of ``T_local`` tokens of the query and
key/value sequences.  Key/value shards (with their segment ids and explicit
positions) travel around the ring; at step ``s`` device ``r`` holds the
shard of ``src = (r - s) mod n`` and runs the flash-attention kernels on
(its queries, that shard) with the *global* positions of both, given as
piece offsets (see core_triton.attention.flash_common):

* contiguous layout: one piece, offset ``rank * T_local``;
* zig-zag layout (causal load balance): device ``r`` holds chunks ``r`` and
  ``2n-1-r`` of ``2n`` chunks of ``c = T_local / 2`` tokens: two pieces with
  offsets ``r*c`` and ``(2n-1-r)*c - c``.

The same offsets give the bias's columns (its last axis spans every key, in
global order).  The bias gradient of a step covers only that step's keys
(``[B|1, HQ|1, T_local, T_local]``, local key order, complete: every column
belongs to one shard); the bindings write its pieces into the one
global-width gradient (:func:`bias_pieces`), so no step allocates the global
width.  Blocks the mask removes are skipped by the kernels' loop
bounds; a (query shard, key shard) pair the mask removes entirely (known
from the layout: :class:`RingSchedule`) launches nothing, and a window
that needs no far shard shortens the walk.  Partial outputs are float32 and merged by log-sum-exp
(``softmax_parts.ring_merge_plan``); sinks join once, after the merge
(``softmax_parts.ring_sinks_plan``).  :class:`RingSchedule` is the step
schedule both bindings walk; they keep only the moving of shards
(``ppermute`` / ``torch.distributed``) and their autodiff plumbing.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from core_triton.attention import flash as fa
from core_triton.attention import packed as packed_ids
from core_triton.common.checks import check_cu_seqlens
from core_triton.common.launch import LaunchPlan, TensorInfo
from core_triton.common.utils import cached_checks


def offsets(rank, n: int, t_local: int, zigzag: bool) -> list:
    """Piece offsets of the shard of ``rank`` (an int or a traced/array
    scalar: only + and * are used)."""
    if not zigzag:
        return [rank * t_local]
    c = t_local // 2
    return [rank * c, (2 * n - 1 - rank) * c - c]


def bias_pieces(src, n: int, t_local: int, zigzag: bool) -> list[tuple]:
    """``(local_start, global_start, length)`` of each run of the keys of
    ``src``'s shard: local key columns ``local_start ..`` are the bias's
    global columns ``global_start ..`` (``src`` may be traced: only + and *
    are used)."""
    pieces = 2 if zigzag else 1
    c = t_local // pieces
    return [(p * c, p * c + off, c) for p, off in enumerate(offsets(src, n, t_local, zigzag))]


@dataclass(frozen=True)
class RingStep:
    """Step ``index`` of the ring on one device: the shard of ``src`` is
    visiting; the kernels take ``q_offsets`` (this device's piece offsets)
    and ``k_offsets`` (``src``'s); the step's bias gradient
    (``[.., T_local]``, local key order) fills the global columns of
    ``bias_pieces``; ``last``: no shard is sent on after it.
    ``masked_out``: whether the mask removes every (query, key) pair of the
    step, so that nothing is launched for it: True/False for an int rank, a
    traced bool for a traced one, None when the schedule cannot tell
    (explicit positions; a zig-zag layout with a window).  ``src``, the
    offsets and ``masked_out`` are ints/bools, or traced scalars when the
    rank is (only +, *, comparisons and ``&``/``|`` are used)."""

    index: int
    src: Any
    q_offsets: tuple
    k_offsets: tuple
    bias_pieces: tuple
    last: bool
    masked_out: Any


@dataclass(frozen=True)
class RingSchedule:
    """The ring's step schedule, which both bindings walk: ``n`` devices
    holding ``t_local`` tokens each, contiguous or zig-zag; ``window``: the
    sliding window as ``(left, right)`` (flash's validated pair) or None.
    At step ``s`` device ``rank`` holds the shard of ``(rank - s) mod n``.

    In the contiguous layout with global positions the mask decides which
    shards a device's queries can see at all: with a causal mask none after
    its own, with a window only those within reach.  Such steps are
    ``masked_out`` (the bindings launch and allocate nothing for them; the
    shards still pass through).  When no device needs a shard more than
    ``k`` places behind its own and none after it (a window with
    ``right == 0`` or a causal mask), the ring walks only ``span() = k + 1``
    steps: shards go no further than they are needed, and the backward's
    dK/dV accumulators go home in one hop of ``home_shift()`` places."""

    n: int
    t_local: int
    zigzag: bool
    causal: bool = False
    explicit_positions: bool = False
    window: tuple | None = None

    def _by_layout(self) -> bool:
        """Whether the layout alone decides which shard pairs the mask removes."""
        return not self.zigzag and not self.explicit_positions

    def span(self) -> int:
        """Steps walked (1 to ``n``)."""
        if not self._by_layout() or self.window is None:
            return self.n
        left, right = self.window
        if right > 0 and not self.causal:
            return self.n  # shards after a device's own are needed
        # Step s (keys s shards back): its nearest pair is (s - 1) * t + 1 apart.
        reach = 0 if left == 0 else (left - 1) // self.t_local + 1
        return min(self.n, reach + 1)

    def home_shift(self) -> int:
        """Places (forward) the accumulators of the last step's shard travel
        to reach their owner after the walk: 1 for a full ring, 0 when only
        the home step is walked."""
        return (self.n - self.span() + 1) % self.n

    def masked(self, rank, src):
        """Whether the mask removes every pair of (``rank``'s queries,
        ``src``'s keys): a bool, a traced bool, or None (not known here)."""
        if not self._by_layout():
            return None if (self.zigzag and self.window is not None) or self.explicit_positions else False
        t = self.t_local
        later, earlier = src > rank, src < rank
        out = False
        if self.causal:
            out = later
        elif self.window is not None:
            out = later & ((src - rank - 1) * t + 1 > self.window[1])
        if self.window is not None:
            out = out | (earlier & ((rank - src - 1) * t + 1 > self.window[0]))
        return out

    def steps(self, rank) -> list[RingStep]:
        """The ``span()`` steps of device ``rank`` (an int, or a traced scalar)."""
        n, t, zz = self.n, self.t_local, self.zigzag
        mine = tuple(offsets(rank, n, t, zz))
        m = self.span()
        out = []
        for s in range(m):
            src = (rank - s) % n
            out.append(
                RingStep(
                    index=s,
                    src=src,
                    q_offsets=mine,
                    k_offsets=tuple(offsets(src, n, t, zz)),
                    bias_pieces=tuple(bias_pieces(src, n, t, zz)),
                    last=s + 1 == m,
                    masked_out=False if s == 0 else self.masked(rank, src),
                )
            )
        return out


@cached_checks(maxsize=256)
def plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    n: int,
    zigzag: bool,
    q_segment_ids: TensorInfo | None = None,
    kv_segment_ids: TensorInfo | None = None,
    softmax_aux: TensorInfo | None = None,
    bias: TensorInfo | None = None,
    sliding_window=None,
    causal=False,
    logits_soft_cap=None,
    softmax_scale=None,
    q_positions: TensorInfo | None = None,
    kv_positions: TensorInfo | None = None,
    return_lse=False,
) -> tuple[fa.AttentionPlans, bool, RingSchedule]:
    """Check the arguments (local shards; ``bias [B|1, HQ|1, T_local,
    n*T_local]``) and plan one ring step: ``(plans, return_lse,
    schedule)``.  The plans' forward takes no sinks (the bindings add them
    once after the merge) and gives float32 partial outputs; the backward
    gives float32 gradients; ``schedule`` is the :class:`RingSchedule` of
    these options (causal, window, explicit positions) that both bindings
    walk."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"the ring size must be a positive int, got {n!r}")
    t_local = query.shape[1] if query.ndim == 4 else 0
    opts, return_lse = fa.validate(
        query,
        key,
        value,
        q_segment_ids,
        kv_segment_ids,
        softmax_aux,
        bias,
        sliding_window,
        causal,
        logits_soft_cap,
        softmax_scale,
        q_positions,
        kv_positions,
        return_lse,
        kv_len=n * key.shape[1],
    )
    if key.shape[1] != t_local:
        raise ValueError(f"query and key shards must have one length, got {t_local} and {key.shape[1]}")
    if zigzag and t_local % 2:
        raise ValueError(f"zigzag needs an even shard length (two chunks per device), got {t_local}")
    pieces = 2 if zigzag else 1
    chunk = t_local // pieces
    opts = fa.Options(
        causal=opts.causal,
        window=opts.window,
        cap=opts.cap,
        scale=opts.scale,
        positions=opts.positions,
        q_pieces=pieces,
        k_pieces=pieces,
        q_chunk=chunk,
        k_chunk=chunk,
    )
    if opts.positions == "explicit":
        q_positions = q_positions or TensorInfo((t_local,), "int32", (1,))
        kv_positions = kv_positions or TensorInfo((t_local,), "int32", (1,))
    # One segment-id array given: it is the keys' too, and travels with them.
    if q_segment_ids is None and kv_segment_ids is not None:
        q_segment_ids = kv_segment_ids
    if kv_segment_ids is None and q_segment_ids is not None:
        kv_segment_ids = q_segment_ids
    step = fa.attention_plans(
        query,
        key,
        value,
        opts,
        q_segment_ids,
        kv_segment_ids,
        None,
        bias,
        q_positions,
        kv_positions,
        out_dtype="float32",
        grad_dtype="float32",
    )
    schedule = RingSchedule(n, t_local, zigzag, opts.causal, opts.positions == "explicit", opts.window)
    return step, return_lse, schedule


def packed(
    query: TensorInfo, n: int, cu_seqlens: TensorInfo | None, index: dict[str, TensorInfo | None]
) -> tuple[dict[str, TensorInfo | None], tuple[LaunchPlan, ...]]:
    """Packed input for the ring: ``cu_seqlens`` ``[N+1]`` (int32/int64,
    batch 1) gives the sequences' boundaries in the *global* token order
    (before any zig-zag reordering), shared by queries and keys.

    Returns ``(index, launches)``: unpacked calls get ``index`` (the segment
    ids' and positions' infos) back and no launch; packed ones are checked
    (no segment ids or positions with them) and get the infos of the local
    segment ids the ring reads (``[1, T_local]`` int32, no positions) and
    the two launches that make the *global* ids (``q_segment_ids``,
    ``kv_segment_ids`` ``[1, n*T_local]``, from inputs ``cu_q`` = ``cu_k`` =
    the boundaries; core_triton.attention.packed).  The binding takes each
    device's tokens of them in its layout's order (``zigzag_order``).
    Shared boundaries make the global positions (the ring's default) give
    the per-sequence causal and window masks; an uncovered token has
    segment -1 (query) or -2 (key), so it matches nothing: output 0,
    gradient 0.  The ring does not cut key blocks to sequence ranges: a
    step costs what its causal mask leaves, as with segment ids."""
    if cu_seqlens is None:
        return index, ()
    n_seq = check_cu_seqlens(cu_seqlens, query.shape[0] if query.ndim == 4 else 0)
    for name, t in index.items():
        if t is not None:
            raise ValueError(f"{name} cannot be combined with cu_seqlens (packing sets segments, positions)")
    t_local = query.shape[1]
    local = TensorInfo((1, t_local), "int32", (t_local, 1), query.device)
    infos = {"q_segment_ids": local, "kv_segment_ids": local, "q_positions": None, "kv_positions": None}
    return infos, packed_ids.packed_plans(n_seq, n * t_local, n * t_local)


def call_plans(
    call: fa.AttentionCall, n: int, zigzag: bool
) -> tuple[fa.AttentionPlans, bool, RingSchedule, tuple[LaunchPlan, ...]]:
    """A binding's call, planned: :func:`packed` then :func:`plans`;
    ``(plans, return_lse, schedule, launches)``; ``launches`` make packed
    input's global segment ids (else none).  The ring takes no
    ``cu_seqlens_k``."""
    index, launches = packed(call.query, n, call.cu_seqlens, call.index)
    step, return_lse, schedule = plans(call.query, call.key, call.value, n, zigzag, **call.planned(index))
    return step, return_lse, schedule, launches


def zigzag_order(n: int, length: int) -> list[int]:
    """Token indices of the zig-zag layout: ``global[order]`` is the
    concatenation of the shards of devices 0..n-1."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"ring_size must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"ring_size must be >= 1, got {n}")
    if length % (2 * n):
        raise ValueError(f"zigzag needs seq_len divisible by 2 * ring size = {2 * n}, got {length}")
    c = length // (2 * n)
    order = []
    for r in range(n):
        for chunk in (r, 2 * n - 1 - r):
            order.extend(range(chunk * c, (chunk + 1) * c))
    return order
