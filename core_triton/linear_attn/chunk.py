"""``chunk_linear_attn``: linear attention with scalar gates, chunk-parallel.

The recurrence of docs/api.md#recurrent (restricted to ``g [B,T,H]`` and
``g_gamma [H]``), computed over chunks of ``chunk_size`` tokens that start
at each sequence's first token.  Launch sequence, forward:

1. ``gc``: in-chunk cumsum of ``g`` (the foundation's segment-cumsum
   kernel, float32, same direction as the recurrence); ``g_gamma``'s is
   formed in the kernels;
2. ``h, final``: states entering every chunk, and the final state
   (chunk_fwd_state.py);
3. ``o``: output = inter-chunk (``q @ h``) + intra-chunk
   (chunk_fwd_output.py).

At batch 1 and long sequences the state pass splits over the sequence
(state_split.py): the segments' states from zero, the carry over segments
(``seg_start``, ``final``), then, where the chunk states are float32, ``o``
from each segment's start state with the chunk states kept in registers
(chunk_fwd_output_segment_kernel): no ``h`` in memory, and the backward begins
by storing ``h`` from ``seg_start``; with half-precision states the
segments store ``h`` for step 3.  A call no gradient follows
(``OpPlans.inference``) keeps nothing for a backward: its output pass
carries the segments itself (no carry launch, no ``seg_start``), its pass
from zero skips each sequence's last segment, and both form ``g``'s
in-chunk cumsum themselves (no step 1).

Backward (from ``do`` and the final state's cotangent ``dht``):

0. ``h`` (after the segment output pass only, see above);
1. ``dh, dh0``: gradients of the states leaving every chunk, and of the
   initial state (chunk_bwd_state.py; split like the forward's);
2. ``dv`` (chunk_bwd_dv.py);
3. ``dq, dk, w`` with ``w`` the per-token gate quantity
   (chunk_bwd_dqk.py, which derives it);
4. ``dg``: suffix sums of ``w`` per sequence (prefix sums when reversed),
   the foundation's global cumsum;
5. ``dg_gamma``: column sums of ``dg`` (common/reductions.py).

Steps 4 and 5 run only for a gate that gets a gradient (``g``, or a
``g_gamma`` unless ``gamma_grad`` is False, as lightning's constant decay
is).  Where none does and each query head has its own state head, a split
training call (batch 1, or packed input) takes the *gradient walks*
instead of steps 0-3: its forward is the segment output pass from
``seg_start`` (half-precision states too), and its backward carries the
gradient over the segments (``dseg_start``, ``dh0``), then computes ``dq``,
``dv`` and ``dk`` with chunk_fwd_output_segment_kernel in other roles, the
chunk states and their gradients in registers (see "gradient walks"
below): nothing of size ``[chunks, H, K, V]`` in memory either way.

``reverse=True`` runs natively: chunks still start at each sequence's
first token, are visited last to first, and their gates are suffix sums.

Inputs by name: ``query``, ``key``, ``value``, ``g``, ``g_gamma``,
``initial_state`` (those given, contiguous), and for packed input
``cu_seqlens`` plus ``prepare_chunk_offsets(cu_seqlens, size)`` under each
name of the plans' ``offsets``.  The backward also reads the
forward outputs named in ``residuals``, ``do`` (output's shape and dtype)
and ``dht`` (``[N, H, K, V]`` float32).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

from core_triton.common import checks, reductions, sequences
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.op import OpPlans
from core_triton.common.runtime import is_interpreted, multiprocessor_count
from core_triton.common.utils import cdiv, contiguous_strides, next_power_of_2
from core_triton.cumsum import plan as _cumsum_plan
from core_triton.linear_attn import args as _linear_attn_args
from core_triton.linear_attn import shared_memory, state_split
from core_triton.linear_attn.args import LinearAttnArgs, linear_attn_plans
from core_triton.linear_attn.chunk_bwd_dqk import chunk_bwd_dqk_kernel
from core_triton.linear_attn.chunk_bwd_dv import chunk_bwd_dv_kernel
from core_triton.linear_attn.chunk_bwd_state import (
    chunk_bwd_state_kernel,
    chunk_bwd_state_segment_kernel,
)
from core_triton.linear_attn.chunk_fwd_output import chunk_fwd_output_kernel, chunk_fwd_output_segment_kernel
from core_triton.linear_attn.chunk_fwd_state import chunk_fwd_state_kernel, chunk_fwd_state_segment_kernel
from core_triton.linear_attn.state_split import state_split_carry_kernel

MIN_CHUNK = 16  # tl.dot needs every dimension >= 16
MAX_CHUNK = 256  # a chunk's [BT, BT] score tile must fit in registers

# Tile sizes and launch options per kernel, chosen here rather than by
# triton.autotune: every (shape, gates, dtype) specialisation would otherwise
# compile every config, which made the GPU test suite take many minutes.
# Values measured on the H100 (bf16, B=4, T=4096, H=16, K=V=128, chunk 64);
# benchmarks may override them (keys: the kernel names below).
TILE_OVERRIDES: dict[str, dict] = {}


def _tiles(
    kernel: str,
    K: int,
    V: int,
    BT: int,
    interpreted: bool,
    *,
    itemsize: int = 4,
    state_itemsize: int = 4,
    ieee: bool = True,
    group: int = 1,
    limit: int = shared_memory.H100_SHARED_BYTES,
    half_products: bool = False,
    split: bool = False,
) -> dict:
    """BK, BV, num_warps, num_stages of one kernel.

    Compiled (``interpreted=False``): the measured tiles, or where their
    modelled shared memory (shared_memory.need) exceeds ``limit`` bytes,
    the largest smaller tiles that fit, then the same without pipelining.
    ``itemsize``/``state_itemsize``: bytes per input/state element,
    ``ieee``: float32 inputs, ``group``: HQ // H; the defaults are the worst
    case (float32, no grouped queries).  ``half_products``: a state pass
    whose updates are single half-precision products (no float32 split),
    which pipelines three stages deep where they fit.  ``split``: a
    ``chunk_state`` launch of the split plans (state_split.py: the segment
    passes, the carry), which takes all of K (up to 128) in one tile.  Where
    nothing fits (float32 inputs with 256-token chunks: the [BT, BT] float32
    scores alone take 256 KiB) the smallest tiles are returned, or for
    ``chunk_output_segment`` (whose BK is all of K) None."""
    kp, vp = max(16, next_power_of_2(K)), max(16, next_power_of_2(V))
    # The segment output pass holds a whole [K, BV] state: BK is all of K.
    whole_k = kernel == "chunk_output_segment"
    if interpreted:
        # Whole numpy tiles run fastest; 64 still exercises multi-tile loops.
        t = dict(BK=kp if whole_k else min(kp, 64), BV=min(vp, 64), num_warps=4, num_stages=2)
        return {**t, **TILE_OVERRIDES.get(kernel, {})}
    t = {
        "chunk_state": dict(BK=min(kp, 64), BV=min(vp, 64), num_warps=4, num_stages=2),
        "chunk_output": dict(BK=min(kp, 128), BV=min(vp, 64), num_warps=4, num_stages=2),
        "chunk_output_segment": dict(BK=kp, BV=min(vp, 64 if kp <= 128 else 32), num_warps=4, num_stages=2),
        "chunk_state_backward": dict(BK=min(kp, 64), BV=min(vp, 64), num_warps=4, num_stages=2),
        "chunk_dv": dict(BK=min(kp, 128), BV=min(vp, 64), num_warps=4, num_stages=2),
        # All of K in one tile where it fits (no recomputed scores).
        "chunk_dqk": dict(BK=kp, BV=min(vp, 64), num_warps=8, num_stages=2),
    }[kernel]
    if split and kernel == "chunk_state":
        # H100, bf16, B1 T32k, H16, K = V = 128: chunk g's forward 0.410 ->
        # 0.403 ms, lightning's forward+backward 1.30-1.33 -> 1.28 (the
        # segments' pass from zero reads k and v once for both K tiles).
        t["BK"] = min(kp, 128)
    if BT >= 128:
        t["num_warps"] = 8
    t = {**t, **TILE_OVERRIDES.get(kernel, {})}
    sizes = dict(itemsize=itemsize, state_itemsize=state_itemsize, ieee=ieee, group=group)
    options = shared_memory.candidates(t["BK"], t["BV"], t["num_stages"])
    if whole_k:
        options = [o for o in options if o[0] == t["BK"]]
    for bk, bv, stages in options:
        if shared_memory.need(kernel, BT, bk, bv, stages, **sizes) <= limit:
            # H100, bf16, B1 T32k, H16, K = V = 128: 3 stages took the
            # lightning-shaped forward's state pass from zero from 0.17 to
            # about 0.06 ms; with float32-split updates they cost time
            # (chunk g's training forward 0.56 -> 0.61 ms).
            deeper = half_products and kernel in ("chunk_state", "chunk_state_backward") and stages == 2
            deeper = deeper and "num_stages" not in TILE_OVERRIDES.get(kernel, {})
            if deeper and shared_memory.need(kernel, BT, bk, bv, 3, **sizes) <= limit:
                stages = 3
            return {**t, "BK": bk, "BV": bv, "num_stages": stages}
    # Nothing fits: the smallest tiles (the segment output pass: None, and
    # the plan stores the chunk states for chunk_output instead).
    return None if whole_k else {**t, "BK": bk, "BV": bv, "num_stages": stages}


def kernel_chunk(chunk: int, dtype: str) -> int:
    """The chunk length the kernels run for a ``chunk_size`` of ``chunk``.

    ``chunk_size`` only groups the computation (the result is the same
    recurrence, up to rounding), so where a chunk's tiles cannot fit in
    shared memory the kernels run shorter chunks: float32 inputs with
    256-token chunks, whose ``[256, 256]`` float32 score tile alone takes
    256 KiB against the H100's 227 KiB, run on 128-token chunks."""
    return min(chunk, 128) if dtype == "float32" else chunk


def check_chunk_size(chunk_size) -> int:
    chunk = checks.check_power_of_two(chunk_size, "chunk_size")
    if not MIN_CHUNK <= chunk <= MAX_CHUNK:
        raise ValueError(
            f"chunk_size must be a power of two between {MIN_CHUNK} and {MAX_CHUNK}, got {chunk}"
        )
    return chunk


def plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    g: TensorInfo | None = None,
    g_gamma: TensorInfo | None = None,
    softmax_scale=None,
    initial_state: TensorInfo | None = None,
    reverse=False,
    cu_seqlens: TensorInfo | None = None,
    chunk_size=64,
    gamma_grad: bool = True,
) -> OpPlans:
    """Check the arguments (ValueError/TypeError naming the culprit) and
    plan the forward and backward launches.  The values of ``cu_seqlens``
    are never read on the host (the kernels clamp them; the bindings'
    ``check_cu_seqlens`` checks them on request).  ``gamma_grad`` False:
    ``g_gamma`` is a constant (lightning's decay), whose gradient the
    backward neither computes nor returns."""
    args = _linear_attn_args.validate(
        query,
        key,
        value,
        g=g,
        g_gamma=g_gamma,
        softmax_scale=softmax_scale,
        initial_state=initial_state,
        reverse=reverse,
        cu_seqlens=cu_seqlens,
    )
    chunk = check_chunk_size(chunk_size)
    if args.packed and args.N == 0 and args.T != 0:
        raise ValueError(f"cu_seqlens holds no sequence but the inputs have seq_len {args.T}")
    return _make_plans(
        args,
        kernel_chunk(chunk, args.dtype),
        g.dtype if g is not None else None,
        g_gamma.dtype if g_gamma is not None else None,
        initial_state.dtype if initial_state is not None else None,
        cu_seqlens.dtype if cu_seqlens is not None else None,
        gamma_grad=bool(gamma_grad) or g_gamma is None,
    )


def _renamed(
    plan: LaunchPlan, inputs: Mapping[str, str], outputs: tuple[str, ...] | None = None
) -> LaunchPlan:
    """A foundation plan with its inputs (and outputs) renamed for this op."""
    params = tuple(In(inputs.get(p.name, p.name)) if isinstance(p, In) else p for p in plan.params)
    return dataclasses.replace(plan, params=params, output_names=outputs or plan.output_names)


def _info(shape, dtype) -> TensorInfo:
    return TensorInfo(tuple(shape), dtype, contiguous_strides(shape))


@functools.lru_cache(maxsize=256)
def _make_plans(
    a: LinearAttnArgs,
    BT: int,
    g_dtype,
    gamma_dtype,
    h0_dtype,
    cu_dtype,
    forward_only: bool = False,
    gamma_grad: bool = True,
) -> OpPlans:
    """The op's plans; ``forward_only``: plans whose forward is the one for
    calls that no gradient follows (``OpPlans.inference`` of the others);
    ``gamma_grad`` False: no gradient for ``g_gamma``."""
    B, T, HQ, H, K, V, N = a.B, a.T, a.HQ, a.H, a.K, a.V, a.N
    use_g, use_gamma, use_h0 = g_dtype is not None, gamma_dtype is not None, h0_dtype is not None
    # The per-token gate quantity w (chunk_bwd_dqk.py), for a gradient of g
    # or of a g_gamma that gets one.
    need_w = use_g or (use_gamma and gamma_grad)
    NT = cdiv(T, BT)
    # Chunk slots per batch row: packed input gets an upper bound known from
    # shapes alone, so traced cu_seqlens work under jax.jit.
    NS = NT + N if a.packed else NT
    n_iter = max(N, 1).bit_length() + 1
    empty = B * T == 0
    ieee = a.dtype == "float32"
    # Chunk states in float32, or in the half dtype the tensor cores
    # multiply.  A per-token gate keeps them float32 in every dtype: its
    # gradient sums q*dq - k*dk, terms that cancel, and half-precision
    # states (and decay-weighted keys rounded to half before the state
    # update) left bf16 d_g 1.4e-2 to 3.4e-2 off at K=128 (tested).
    state_f32 = ieee or use_g
    h_dtype = "float32" if state_f32 else a.dtype
    h_shape = (B * NS, H, K, V)

    # Packed input: rows that no sequence covers (only possible when traced
    # cu_seqlens break the contract) are written by no program; they get 0
    # (output 0, gradient 0: core_triton.common.sequences) from a launch
    # after the kernels that writes only those rows, where a zero fill of
    # the whole output before them cost 0.04 ms per output (H100, B1 T32k
    # H16 V128 bf16; 5-6% of the forward in 16 documents).
    def uncovered(*outputs):
        if not a.packed:
            return []
        return [sequences.zero_uncovered_plan(n, shape, a.dtype, 1, N, BT, NS) for n, shape in outputs]

    state_shape = (N, H, K, V)

    def opt(name, present):
        # Absent optional pointers: a dummy input plus a constexpr flag.
        return In(name) if present else In("query")

    cu = opt("cu_seqlens", a.packed)
    co = opt("chunk_offsets", a.packed)
    gc = opt("gc", use_g)
    gamma = opt("g_gamma", use_gamma)
    flags = dict(
        BT=BT,
        USE_G=use_g,
        USE_GAMMA=use_gamma,
        REVERSE=a.reverse,
        IS_VARLEN=a.packed,
        IEEE=ieee,
        STATE_F32=state_f32,
    )
    offsets = [("chunk_offsets", BT)] if a.packed else []

    interpreted = is_interpreted(chunk_fwd_state_kernel)

    def tiles_of(name, half_products=False, dims=(K, V), split=False):
        return _tiles(
            name,
            *dims,
            BT,
            interpreted,
            itemsize=4 if ieee else 2,
            state_itemsize=4 if state_f32 else 2,
            ieee=ieee,
            group=HQ // H,
            half_products=half_products,
            split=split,
        )

    def tiled(name, kernel, grid, params, outputs, output_names, constexprs, split=False, dims=(K, V)):
        """A launch of ``kernel`` with this op's tiles (for K x V given as
        ``dims``); ``grid`` maps them to the grid (empty problems launch
        nothing); ``split``: see _tiles."""
        t = tiles_of(name, half_products=not constexprs.get("STATE_F32", True), dims=dims, split=split)
        warps, stages = t.pop("num_warps"), t.pop("num_stages")
        return LaunchPlan(
            kernel=kernel,
            grid=grid(t),
            params=params,
            outputs=outputs,
            output_names=output_names,
            constexprs={**constexprs, **t},
            num_warps=warps,
            num_stages=stages,
        )

    def state_grid(t):
        return (cdiv(K, t["BK"]), cdiv(V, t["BV"]), N * H)

    def slot_grid(heads):
        return lambda t: (0, 0, 0) if empty else (cdiv(V, t["BV"]), NS, B * heads)

    forward = []
    cumsum = []
    if use_g:
        cum = _cumsum_plan.make_plans(
            _info((B, T, H), g_dtype),
            _info((N + 1,), cu_dtype) if a.packed else None,
            chunk=BT,
            reverse=a.reverse,
            scale=None,
            head_first=False,
            out_dtype="float32",
        )
        cumsum = [_renamed(p, {"x": "g"}, ("gc",)) for p in cum.forward]
    # The state passes split over the sequence (state_split.py): S chunks
    # per segment, NG segment slots per batch row (packed: in all, an upper
    # bound known from shapes, like the chunk slots).
    st = tiles_of("chunk_state")
    tiles = cdiv(K, st["BK"]) * cdiv(V, st["BV"])
    # A split forward can keep the chunk states out of memory (the segment
    # output pass below) where its tiles fit: training calls with float32
    # chunk states (see below for half-precision ones), calls that no
    # gradient follows with any (state_split.FORWARD_ONLY_HALF_STATES).
    fits = tiles_of("chunk_output_segment") is not None
    fits = fits and bool(state_split.SPLIT_OVERRIDE.get("fused_output", 1))
    fusable = state_f32 and fits
    fusable_alone = fits and (state_f32 or state_split.FORWARD_ONLY_HALF_STATES)
    S = state_split.segment_chunks(N if a.packed else B, H, tiles, NT, multiprocessor_count())
    S = 0 if empty else S
    # A forward no gradient follows splits wherever its chunk states then
    # stay out of memory (state_split.FORWARD_ONLY_SEGMENTS), else as a
    # training call does.
    per_sequence = NT // max(N, 1) if a.packed else NT
    S_own = state_split.forward_only_segment_chunks(per_sequence) or S
    S_alone = S_own if fusable_alone and not empty else S
    if fusable_alone and not empty:
        # Longer still where the output pass keeps a wave of programs: its
        # carry over the segments before each program's own grows with them.
        out_tiles = cdiv(V, tiles_of("chunk_output_segment")["BV"])
        S_long = state_split.long_segment_chunks(
            per_sequence, N if a.packed else B, H * out_tiles, multiprocessor_count(), K
        )
        S_alone = S_long or S_alone
    # The backward's gradient walks (see "gradient walks" below): the
    # segment output pass's kernel in three more roles, whose whole-K tiles
    # must fit both ways round (K x V and V x K), with no per-token gate
    # quantity to form and one query head per state head (its mirrored
    # walks would take the group's sum over the key's role).  Where the
    # training call splits, and for packed input (the longest document's
    # walk bounds the whole-sequence passes), in FORWARD_ONLY_SEGMENTS'
    # lengths (S_own; else the training split's).  H100, lightning bf16 H16
    # K = V = 128, forward+backward ms: B1 T32k 2.03 -> 1.32 (segments of
    # 64), in 16 documents 1.70 -> 1.61 (16; 32: 1.68); B4 T4k (not split)
    # 0.81 -> 0.86, not taken.
    walks = (bool(S) or a.packed) and fits and HQ == H and not need_w and not forward_only and not empty
    walks = walks and tiles_of("chunk_output_segment", dims=(V, K)) is not None
    walks = walks and bool(state_split.SPLIT_OVERRIDE.get("gradient_walks", state_split.GRADIENT_WALKS))
    walks = walks and bool(S_own)
    if walks:
        # The walks keep no chunk state in memory, forward or backward: the
        # forward takes the segment output pass (from seg_start).
        S, fusable = S_own, True
    # A forward alone differs where it splits differently, or carries the
    # segments inside its output pass.
    own_forward = bool(S_alone) and (S_alone != S or fusable_alone or fusable)
    own_forward = own_forward and not state_split.SPLIT_OVERRIDE.get("alone_as_trained")
    if forward_only:
        S, fusable = S_alone, fusable_alone
    # A forward no gradient follows that carries the segments in its output
    # pass (below) has two kernels read g: each forms g's in-chunk cumsum
    # itself (G_RAW), and no cumsum launch writes gc (H100, chunk g
    # forward B1 T32k 0.389 -> 0.366 ms, in 16 documents 0.473 -> 0.435).
    raw_g = use_g and forward_only and bool(S) and fusable
    if not raw_g:
        forward += cumsum
    if S:
        NG = NS // S + N if a.packed else cdiv(NT, S)
        seg_shape, seg_rows = (B * NG, H, K, V), (B * NG, H)
        seg_scalars = (T, N, n_iter, NT, NS, NG, S)

        def seg_grid(t):
            return (cdiv(K, t["BK"]) * cdiv(V, t["BV"]), NG, B * H)

        def split_pass(
            name, kernel, lead, start, outputs, names, store, extra, state_f32=state_f32, skip_last=False
        ):
            """Segment pass: ``store`` False from zero, else from ``start``;
            ``state_f32`` False: half-precision update products; ``skip_last``
            (forward): no delta for each sequence's last segment visited, and
            g read raw where ``raw_g``."""
            flag = "STORE_DH" if name == "chunk_state_backward" else "STORE_H"
            raw = raw_g and skip_last
            heads = dict(HQ=HQ, H=H) if flag == "STORE_DH" else dict(H=H, SKIP_LAST=skip_last, G_RAW=raw)
            return tiled(
                name,
                kernel,
                seg_grid,
                params=(*lead, In("g") if raw else gc, gamma, start, cu, co, *extra, *seg_scalars),
                outputs=outputs,
                output_names=names,
                constexprs=dict(**heads, K=K, V=V, **{flag: store}, **{**flags, "STATE_F32": state_f32}),
                split=True,
            )

        def carry(start, use_start, last_first, names, final_dtype):
            """The carry over segments ``names[0]`` (its ``_delta``,
            ``_decay`` in, ``_start`` out), ``names[1]`` the final state."""
            seg = names[0]
            return tiled(
                "chunk_state",
                state_split_carry_kernel,
                state_grid,
                params=(start, In(seg + "_delta"), In(seg + "_decay"), cu, co, T, NT, NS, NG, S),
                outputs=(OutputSpec(seg_shape, "float32"), OutputSpec(state_shape, final_dtype)),
                output_names=(seg + "_start", names[1]),
                constexprs=dict(
                    H=H, K=K, V=V, BT=BT, USE_START=use_start, LAST_FIRST=last_first, IS_VARLEN=a.packed
                ),
                split=True,
            )

        seg_out = (OutputSpec(seg_shape, "float32"), OutputSpec(seg_rows, "float32"))
        pad = OutputSpec((1,), "float32")  # the seg_decay a storing pass leaves alone
        store_h = split_pass(
            "chunk_state", chunk_fwd_state_segment_kernel, (In("key"), In("value")), In("seg_start"),
            (OutputSpec(h_shape, h_dtype), pad), ("h", "seg_pad"), True, (),
        )  # fmt: skip
        # The segments' states from zero: float32-exact update products
        # where the backward recomputes the chunk states from them; a
        # forward no gradient follows multiplies in the inputs' half dtype,
        # as its output pass does (chunk_fwd_output_segment_kernel).
        half_from_zero = forward_only and fusable and not ieee
        # A forward no gradient follows keeps no seg_start: its output pass
        # carries the segments itself (CARRY) and stores the final states,
        # one launch fewer (H100, B1 T32k: the carry took 0.02 ms, 0.05 in
        # 16 documents, where it wrote and read back every segment's start).
        # Each sequence's last segment visited then needs no delta (its
        # output program walks it and stores the final state): the pass from
        # zero skips it, 1 / n of its reads at n segments a sequence.
        carry_in_output = forward_only and fusable
        forward.append(
            split_pass(
                "chunk_state", chunk_fwd_state_segment_kernel, (In("key"), In("value")), In("key"),
                seg_out, ("seg_delta", "seg_decay"), False, (), state_f32 and not half_from_zero,
                skip_last=carry_in_output,
            )
        )  # fmt: skip
        if not carry_in_output:
            h0 = opt("initial_state", use_h0)
            forward.append(carry(h0, use_h0, a.reverse, ("seg", "final"), "float32"))
        # Float32 chunk states (a per-token gate, or float32 inputs): the
        # output from the segments' start states, no chunk states in memory
        # (chunk_fwd_output_segment_kernel), and the backward stores them.  On
        # the H200 at B1 T32k (bf16, H16, K = V = 128) that took chunk g
        # from 1.30 to 0.74 ms forward and 3.50 to 3.36 forward+backward.
        # Half-precision states (no per-token gate, half inputs) are stored
        # by a training forward as before: the backward's pass to store them
        # cost lightning more (1.80 -> 1.88 ms forward+backward) than the
        # forward saved (0.59 -> 0.51); a forward no gradient follows keeps
        # them in registers (state_split.FORWARD_ONLY_HALF_STATES).  Where
        # the whole-K tiles fit in no shared memory (float32 at K = 256) the
        # forward stores them too.
        fused = fusable
        if fused:
            forward.append(
                tiled(
                    "chunk_output_segment",
                    chunk_fwd_output_segment_kernel,
                    lambda t: (cdiv(V, t["BV"]), NG, B * H),
                    params=(
                        In("query"), In("key"), In("value"), In("g") if raw_g else gc, gamma,
                        In("key") if carry_in_output else In("seg_start"),
                        *((In("seg_delta"), In("seg_decay")) if carry_in_output else (In("key"),) * 2),
                        opt("initial_state", use_h0 and carry_in_output),
                        cu, co, a.scale, T, N, n_iter, NT, NS, NG, S,
                    ),
                    outputs=(
                        OutputSpec((B, T, HQ, V), a.dtype),
                        OutputSpec(state_shape, "float32") if carry_in_output else pad,
                    ),
                    output_names=("o", "final" if carry_in_output else "final_pad"),
                    constexprs=dict(
                        HQ=HQ, H=H, K=K, V=V, CARRY=carry_in_output, USE_H0=use_h0 and carry_in_output,
                        MIRROR=False, START_T=False, G_RAW=raw_g, **flags,
                    ),
                )
            )  # fmt: skip
        else:
            forward.append(store_h)
    else:
        fused = False
        forward.append(
            tiled(
                "chunk_state",
                chunk_fwd_state_kernel,
                state_grid,
                params=(In("key"), In("value"), gc, gamma, opt("initial_state", use_h0), cu, co, T, NT, NS),
                outputs=(OutputSpec(h_shape, h_dtype), OutputSpec(state_shape, "float32")),
                output_names=("h", "final"),
                constexprs=dict(H=H, K=K, V=V, USE_H0=use_h0, **flags),
            )
        )
    scalars = (a.scale, T, N, n_iter, NT, NS)
    if not fused:
        forward.append(
            tiled(
                "chunk_output",
                chunk_fwd_output_kernel,
                slot_grid(HQ),
                params=(In("query"), In("key"), In("value"), gc, gamma, In("h"), cu, co, *scalars),
                outputs=(OutputSpec((B, T, HQ, V), a.dtype),),
                output_names=("o",),
                constexprs=dict(HQ=HQ, H=H, K=K, V=V, **flags),
            )
        )
    forward += uncovered(("o", (B, T, HQ, V)))

    if S:
        lead, extra = (In("query"), In("do")), (a.scale,)
        backward = [store_h] if fused and not walks else []
        backward += [
            split_pass(
                "chunk_state_backward", chunk_bwd_state_segment_kernel, lead, In("query"),
                seg_out, ("dseg_delta", "dseg_decay"), False, extra,
            ),
            carry(In("dht"), True, not a.reverse, ("dseg", "dh0"), h0_dtype or "float32"),
        ]  # fmt: skip
        if not walks:
            backward.append(
                split_pass(
                    "chunk_state_backward", chunk_bwd_state_segment_kernel, lead, In("dseg_start"),
                    (OutputSpec(h_shape, h_dtype), pad), ("dh", "dseg_pad"), True, extra,
                )
            )  # fmt: skip
    else:
        backward = [
            tiled(
                "chunk_state_backward",
                chunk_bwd_state_kernel,
                state_grid,
                params=(In("query"), In("do"), gc, gamma, In("dht"), cu, co, a.scale, T, NT, NS),
                outputs=(OutputSpec(h_shape, h_dtype), OutputSpec(state_shape, h0_dtype or "float32")),
                output_names=("dh", "dh0"),
                constexprs=dict(HQ=HQ, H=H, K=K, V=V, USE_DHT=True, **flags),
            )
        ]

    # Gradient walks: dq, dk and dv from the segments' start states, with
    # the chunk states (h, dh) in registers rather than in memory, each the
    # segment output pass's formula with the inputs in other roles (chunk
    # states h = sum k^T v, gradients dh = scale * sum q^T do plus dht):
    #   dq = scale * (e^b do h^T + (D * do v^T) k): q, k, v = do, v, k; h^T;
    #   dv = e^b' k dh + scale * (D' * k q^T) do: q, k, v = k, q, do; dh;
    #   dk = e^b' v dh^T + scale * (D' * v do^T) q: q, k, v = v, do, q; dh^T;
    # the last two walk each segment backwards (MIRROR, b' = b_tot - b).
    # Without them the backward stores every chunk's h and dh (4x v's bytes
    # each at K = 128 and 64-token chunks in float32, 2x in bf16) for
    # chunk_dv and chunk_dqk to read back.
    def walk(roles, start, out, swapped, mirror):
        Kw, Vw = (V, K) if swapped else (K, V)
        heads = HQ if out == "dq" else H
        # (no CARRY: seg_delta, seg_decay and h0 are unread stand-ins)
        params = (
            *(In(n) for n in roles), gc, gamma, In(start), In("key"), In("key"), In("query"),
            cu, co, a.scale, T, N, n_iter, NT, NS, NG, S,
        )  # fmt: skip
        modes = dict(CARRY=False, USE_H0=False, MIRROR=mirror, START_T=swapped, G_RAW=False)
        return tiled(
            "chunk_output_segment",
            chunk_fwd_output_segment_kernel,
            lambda t: (cdiv(Vw, t["BV"]), NG, B * H),
            params=params,
            outputs=(OutputSpec((B, T, heads, Vw), a.dtype), pad),
            output_names=(out, out + "_pad"),
            constexprs=dict(HQ=HQ, H=H, K=Kw, V=Vw, **modes, **flags),
            dims=(Kw, Vw),
        )

    if walks:
        backward += [
            walk(("do", "value", "key"), "seg_start", "dq", True, False),
            walk(("key", "query", "do"), "dseg_start", "dv", False, True),
            walk(("value", "do", "query"), "dseg_start", "dk", True, True),
        ]
    else:
        backward += [
            tiled(
                "chunk_dv",
                chunk_bwd_dv_kernel,
                slot_grid(H),
                params=(In("query"), In("key"), gc, gamma, In("do"), In("dh"), cu, co, *scalars),
                outputs=(OutputSpec((B, T, H, V), a.dtype),),
                output_names=("dv",),
                constexprs=dict(HQ=HQ, H=H, K=K, V=V, **flags),
            ),
            tiled(
                "chunk_dqk",
                chunk_bwd_dqk_kernel,
                lambda t: (0, 0) if empty else (NS, B * H),
                params=(
                    In("query"),
                    In("key"),
                    In("value"),
                    gc,
                    gamma,
                    In("h"),
                    In("do"),
                    In("dh"),
                    In("dht"),
                    In("final"),
                    cu,
                    co,
                    *scalars,
                ),
                outputs=(
                    OutputSpec((B, T, HQ, K), a.dtype),
                    OutputSpec((B, T, H, K), a.dtype),
                    # Without a gate gradient the kernel writes no w: a zero-filled stand-in.
                    OutputSpec((B, T, H), "float32") if need_w else OutputSpec((1,), "float32", fill=0.0),
                ),
                output_names=("dq", "dk", "w"),
                constexprs=dict(HQ=HQ, H=H, K=K, V=V, USE_DHT=True, STORE_W=need_w, **flags),
            ),
        ]
    backward += uncovered(("dv", (B, T, H, V)), ("dq", (B, T, HQ, K)), ("dk", (B, T, H, K)))
    grads = [("query", "dq"), ("key", "dk"), ("value", "dv")]
    if need_w:
        # dg in g's dtype, unless dg_gamma is summed from it (float32 then).
        dg_dtype = g_dtype if (use_g and not use_gamma) else "float32"
        cum = _cumsum_plan.make_plans(
            _info((B, T, H), "float32"),
            _info((N + 1,), cu_dtype) if a.packed else None,
            chunk=None,
            reverse=not a.reverse,
            scale=None,
            head_first=False,
            out_dtype=dg_dtype,
        )
        steps = list(cum.forward)
        steps[-1] = dataclasses.replace(steps[-1], output_names=("dg",))
        backward += [_renamed(p, {"x": "w", "chunk_offsets": "dg_chunk_offsets"}) for p in steps]
        if a.packed:
            offsets += [("dg_" + name, size) for name, size in cum.offsets]
        if use_g:
            grads.append(("g", "dg"))
    if use_gamma and gamma_grad:
        backward += reductions.head_sum_plans("dg", B * T, H, gamma_dtype, "dg_gamma", interpreted)
        grads.append(("g_gamma", "dg_gamma"))
    if use_h0:
        grads.append(("initial_state", "dh0"))
    residuals = ("seg_start" if fused else "h", "final") + (("gc",) if use_g else ())
    inputs = ("query", "key", "value") + tuple(
        n for n, used in (("g", use_g), ("g_gamma", use_gamma), ("initial_state", use_h0)) if used
    )
    alone = ()
    if own_forward and not forward_only:
        alone = _make_plans(a, BT, g_dtype, gamma_dtype, h0_dtype, cu_dtype, True, gamma_grad).forward
    return linear_attn_plans(
        args=a,
        forward=tuple(forward),
        inference=alone,
        backward=tuple(backward),
        inputs=inputs,
        offsets=tuple(offsets),
        residuals=residuals,
        grads=tuple(grads),
    )
