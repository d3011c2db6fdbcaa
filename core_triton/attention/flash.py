"""``flash_attention``: softmax attention, single device (docs/api.md#flash_attention).

Shapes: ``query [B, Tq, HQ, D]``, ``key [B, Tk, H, D]``, ``value [B, Tk, H,
Dv]`` (``HQ % H == 0``, ``D, Dv <= 256``); ``output [B, Tq, HQ, Dv]`` and
``lse [B, HQ, Tq]`` float32.  Optional: segment ids int32/int64 ``[B, T]``,
positions int32/int64 ``[B, T]`` or ``[T]``, ``softmax_aux`` (sinks) ``[HQ]``
or ``[HQ, S]``, ``bias [B|1, HQ|1, Tq, Tk]``.

Launches (all inputs named as below; absent optional inputs are replaced by
a dummy pointer and a constexpr flag):

* forward: ``flash_fwd_kernel`` -> ``(out, lse)``;
* backward: ``flash_bwd_dq_kernel`` (``o``, ``do``, optional ``dlse``) ->
  ``(dq, delta)``, then ``flash_bwd_dkdv_kernel`` -> ``(dk, dv)``;
* with segment ranges (segment ids, packed input), each of the three main
  kernels runs as a gated pair (:func:`gated_pair`): the rows whose segment
  holds the whole other side go through the kernel of plain attention,
  the others through the ranged one;
* bias gradient, only when the bias needs one (``AttentionPlans.dbias``):
  ``flash_bwd_dbias_kernel`` -> ``dbias`` in the bias's own shape ``[B|1,
  HQ|1, Tq, Tk]`` and dtype, summed over the broadcast dimensions in
  registers in a fixed order (the same bits every run and in both
  bindings).  No ``[B, HQ, Tq, Tk]`` float32 buffer exists: a ``[1, 1, T,
  T]`` bias costs one more bias-sized array.  When the bias needs no
  gradient (PyTorch: ``requires_grad`` False; JAX: the bias is not
  differentiated, see jax_api.flash_attention) nothing is launched.
  The sinks' gradient,
  ``dsink[h, s] = -sum_{b,i} exp(sink[h, s] - lse[b, h, i]) * delta[b, h, i]``
  (0 where the sink is ``-inf``), is a reduction of kernel outputs that the
  bindings do with their own ops.

Inputs ``qoff``/``koff`` (int32, one value per piece) give the positions in
offset mode and the bias's column offsets (see flash_common); the
single-device op uses one piece with offset 0, the ring passes its own.
:func:`attention_plans` is the lower-level entry the ring uses.

Beside it: the argument checks and :class:`Options` (flash_options.py), the
tile configs and stride hints (flash_configs.py), the gradient launches'
plans (flash_bwd_plans.py: this module plans the forward and hands them
what it worked out), and the warp-specialised forward's plan
(flash_tma_plans.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from core_triton.attention import flash_configs, flash_tma_plans
from core_triton.attention.flash_bwd_plans import GradShared, backward_plans
from core_triton.attention.flash_configs import (
    CONFIGS,
    FIXED,
    FLOAT32_256,
    FWD_CONFIGS,
    KERNELS,
    edge_stages,
    length_class,
    measured_choice,
    program_grid,
    program_order,
    stride_hint_bits,
    tuned_kernel,
    unpack,
)
from core_triton.attention.flash_options import (  # noqa: F401 (the op's public helpers)
    MAX_HEAD_DIM,
    AttentionCall,
    Options,
    check_sinks,
    missing_positions,
    validate,
    window_pair,
)
from core_triton.attention.flash_tma_plans import gluon_backward, ws_forward
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import interpreter_requested
from core_triton.common.utils import cached_checks, cdiv, next_power_of_2

# ---- the warp-specialised forward's switch --------------------------------


def set_ws_forward(mode: str, configs: dict | None = None) -> None:
    """The warp-specialised forward: "auto" (sm_90 GPUs), "on" or "off"
    (and its configs); plans made before are dropped."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"mode must be 'auto', 'on' or 'off', got {mode!r}")
    flash_tma_plans.WS_FORWARD = mode
    _replan(flash_tma_plans.WS_CONFIGS, configs)


def set_gluon_forward(mode: str) -> None:
    """The Gluon forward (flash_fwd_gluon): "auto" (sm_90 GPUs, long
    sequences), "on" (every length on a GPU) or "off"; plans made before
    are dropped."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"mode must be 'auto', 'on' or 'off', got {mode!r}")
    flash_tma_plans.GLUON_FORWARD = mode
    replan()


def set_gluon_persistent(on: bool) -> None:
    """Whether the Gluon forward runs as a persistent kernel
    (flash_fwd_gluon_persistent; on by default; off: the kernel of a
    program a tile, at the head dims it takes); plans made before are
    dropped."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be a bool, got {type(on).__name__}")
    flash_tma_plans.GLUON_PERSISTENT = on
    replan()


def set_gluon_ranged(on: bool) -> None:
    """Whether the persistent Gluon forward takes a call with segment ids
    alone (flash_fwd_gluon_ranged; off by default: it is a gated pair's
    first launch, flash_tma_plans.GLUON_RANGED says why); plans made
    before are dropped."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be a bool, got {type(on).__name__}")
    flash_tma_plans.GLUON_RANGED = on
    replan()


def set_gluon_backward(mode: str) -> None:
    """The Gluon backward (flash_bwd_dq_gluon, flash_bwd_dkdv_gluon):
    "auto" (sm_90 GPUs, long sequences), "on" (every length on a GPU,
    unsplit dK/dV) or "off"; plans made before are dropped."""
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"mode must be 'auto', 'on' or 'off', got {mode!r}")
    flash_tma_plans.GLUON_BACKWARD = mode
    replan()


def set_dkdv_splits(splits: int | None) -> None:
    """How many programs share a key block's query-head group in the dK/dV
    kernel: None, the plan's rule (flash_configs.dkdv_splits); an int, that
    many wherever it divides the group (else 1).  Plans made before are
    dropped."""
    if splits is not None and (not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be None or a positive int, got {splits!r}")
    flash_configs.DKDV_SPLITS = splits
    replan()


def set_program_order(order: int | None) -> None:
    """The launch order of the forward, dQ and dK/dV kernels
    (flash_common.block_and_row): None, the plan's rule
    (flash_configs.program_order); 0, 1, 2 or 3, that order on every launch
    whose grid fits it.  Plans made before are dropped."""
    if order not in (None, 0, 1, 2, 3):
        raise ValueError(f"order must be None, 0, 1, 2 or 3, got {order!r}")
    flash_configs.PROGRAM_ORDER = order
    replan()


# Counts replans: a binding that keeps plans per call signature (the torch
# binding's eager memo) drops them when this changes.
GENERATION = 0


def replan() -> None:
    """Drop every plan made so far, after a setting of this module or of
    flash_configs changed (tests and probes that force tiles)."""
    _replan({}, None)


def _replan(table: dict, configs: dict | None) -> None:
    global GENERATION
    if configs is not None:
        table.update(configs)
    attention_plans.cache_clear()
    plans.cache_clear()
    GENERATION += 1


# ---- plans ----------------------------------------------------------------


@dataclass(frozen=True)
class AttentionPlans:
    """``forward``: the launches (one, or a gated pair), inputs ``q, k, v,
    qoff, koff`` and the optional ones, outputs ``(out, lse)`` (run them
    with ``run_steps``).  ``grads(do, o, dlse)`` -> ``(dkdv, dq)``, each a
    tuple of launches likewise, taking also ``lse``: the dQ launches first
    (inputs ``o``, ``do`` and, where ``dlse``, the ``lse`` cotangent
    ``dlse``; outputs ``dq`` and ``delta``), then the dK/dV ones, which
    read ``delta`` (flash_bwd_plans).  ``dbias(do)``: the bias-gradient
    launch (the dK/dV launches' inputs; output ``dbias`` in the bias's
    shape and dtype, its columns the *local* keys ``0..Tk-1``), None
    without a bias; launch it only when the bias needs a gradient."""

    forward: tuple[LaunchPlan, ...]
    grads: Callable[..., tuple[tuple[LaunchPlan, ...], tuple[LaunchPlan, ...]]]
    dbias: Callable[[TensorInfo], LaunchPlan | None]
    qoff: tuple[int, ...]
    koff: tuple[int, ...]


def gated_pair(
    plan: LaunchPlan, first: LaunchPlan | None = None, tiles: tuple | None = None
) -> tuple[LaunchPlan, LaunchPlan]:
    """A ranged launch (``HAS_RANGE``) as two launches over the same
    outputs.  First the kernel of plain attention (no ids, no ranges) runs
    the blocks that hold a row whose segment holds every token of the other
    side (flash_common.gated_rows); then the ranged kernel runs the blocks
    that hold any other row, and writes their rows again, all of them
    right, into the first one's outputs.  So every row ends with a value
    of a kernel that serves it, whatever tiles the two kernels use (each is
    tuned on its own: ``GATE`` is in the autotuning key).

    Why: one segment is the common case (a model's unpacked batch turned
    into ids), and it then runs at plain attention's speed.  The ranged
    kernel's loop bounds and id comparisons cost registers (sm_90, head dim
    64: forward 224 against 168, 2 programs per SM instead of 3).  The price
    is a second launch, whose blocks with nothing to do return at once.
    ``plan``'s last parameters are the dummies of the kernel's ``*_IN``
    pointers, one per output.  ``first``: another first launch (the
    warp-specialised forward, gated), where plain attention takes it;
    ``tiles``: plain attention's ``(kernel, grid, consts, num_warps,
    num_stages, maxnreg)`` (``consts``: its tile and launch order) for the
    first launch (its measured tiles and its order may not be the ranged
    kernel's), else the ranged launch's own."""
    n = len(plan.outputs)
    whole = first
    if whole is None:
        kernel, grid, consts, w, s, cap = tiles or (
            plan.kernel, plan.grid, {}, plan.num_warps, plan.num_stages, plan.maxnreg
        )  # fmt: skip
        # EDGE_STAGES as plain attention's (0: it has no ranged runs).
        flags = {"HAS_SEG": False, "HAS_RANGE": False, "GATE": 1, "EDGE_STAGES": 0}
        whole = dataclasses.replace(
            plan, kernel=kernel, grid=grid, constexprs={**plan.constexprs, **consts, **flags},
            num_warps=w, num_stages=s, maxnreg=cap,
        )  # fmt: skip
    rest = dataclasses.replace(
        plan,
        params=(*plan.params[:-n], *(In(name) for name in plan.output_names)),
        constexprs={**plan.constexprs, "GATE": 2},
        aliases=tuple(enumerate(plan.output_names)),
    )
    return whole, rest


def _strides_or_zero(info: TensorInfo | None, n: int) -> tuple[int, ...]:
    """Strides of an optional input (0 for a broadcast size-1 dim; a 1-D
    ``[T]`` array read as ``[B, T]`` gets batch stride 0)."""
    if info is None:
        return (0,) * n
    if info.ndim < n:
        return (0,) * (n - info.ndim) + tuple(info.strides)
    return tuple(0 if size == 1 else st for size, st in zip(info.shape, info.strides, strict=True))


@functools.lru_cache(maxsize=1024)
def attention_plans(
    q: TensorInfo,
    k: TensorInfo,
    v: TensorInfo,
    opts: Options,
    q_seg: TensorInfo | None = None,
    kv_seg: TensorInfo | None = None,
    sink: TensorInfo | None = None,
    bias: TensorInfo | None = None,
    q_pos: TensorInfo | None = None,
    kv_pos: TensorInfo | None = None,
    out_dtype: str | None = None,
    grad_dtype: str | None = None,
    qoff: tuple[int, ...] = (0,),
    koff: tuple[int, ...] = (0,),
    has_range: bool = False,
) -> AttentionPlans:
    """Plans for one (query block, key block) pair.  ``q_seg``/``kv_seg``:
    either may be the other (one given for both); explicit positions need
    both ``q_pos`` and ``kv_pos`` (the bindings give an ``arange`` for the
    missing one).  ``out_dtype``/``grad_dtype`` default to the input dtype
    (the ring asks for float32 partial results)."""
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    DV = v.shape[3]
    BD, BDV = max(16, next_power_of_2(D)), max(16, next_power_of_2(DV))
    dim_class = flash_configs.dim_class(max(BD, BDV))
    has_seg = q_seg is not None or kv_seg is not None
    explicit = opts.positions == "explicit"
    seg_q = "q_segment_ids" if q_seg is not None else "kv_segment_ids"
    seg_k = "kv_segment_ids" if kv_seg is not None else "q_segment_ids"
    seg_info_q = q_seg if q_seg is not None else kv_seg
    seg_info_k = kv_seg if kv_seg is not None else q_seg
    pos_q = _strides_or_zero(q_pos, 2) if explicit else (0, 0)
    pos_k = _strides_or_zero(kv_pos, 2) if explicit else (0, 0)
    left, right = opts.window if opts.window is not None else (0, 0)
    dot_prec = "ieee" if q.dtype == "float32" else "tf32"
    row64 = max(Tq * abs(q.strides[1]), Tk * abs(k.strides[1]), Tk * abs(v.strides[1]), Tq * HQ * max(D, DV))
    row64 = row64 >= 2**31
    common = dict(
        D=D,
        DV=DV,
        BD=BD,
        BDV=BDV,
        CAUSAL=opts.causal,
        HAS_WINDOW=opts.window is not None,
        HAS_CAP=opts.cap is not None,
        HAS_BIAS=bias is not None,
        HAS_SEG=has_seg,
        # Packed input (core_triton.attention.packed): each block's loop
        # runs over the other side's blocks of its own sequences only.
        HAS_RANGE=has_range and opts.q_pieces == 1 and opts.k_pieces == 1,
        POS_MODE=1 if explicit else 0,
        # A per-block test of ids or positions, where nothing better bounds
        # the blocks: ranges do for segment ids with offset positions (a
        # loop with a branch is not pipelined, and a kernel that has one
        # serialises its matrix products everywhere).
        TEST=explicit or (has_seg and not (has_range and opts.q_pieces == 1 and opts.k_pieces == 1)),
        NQP=opts.q_pieces,
        NKP=opts.k_pieces,
        ROW64=row64,
        DOT_PREC=dot_prec,
        GATE=0,
    )
    ranged = common["HAS_RANGE"]
    # The plain and causal paths (what models run most) are autotuned, and
    # so are segment ids with their ranges (same loops, pipelined: only the
    # tiles at a segment's edges compare ids); the other features take one
    # fixed config.
    tuned = not (
        (has_seg and not ranged)
        or explicit
        or bias is not None
        or opts.cap is not None
        or opts.window is not None
    )
    fixed = 0 if interpreter_requested() else FIXED[dim_class]
    # The ring asks for float32 partials: no register-capped tiles.
    capped = out_dtype is None and grad_dtype is None

    def config(kind, table, ranged=ranged, splits=1):
        """(BM, BN, num_warps, num_stages[, maxnreg]) of ``kind``, or None
        to autotune.
        ``ranged``: for the ranged kernel (False: plain attention's, the
        first of a gated pair); ``splits``: the dK/dV split (None while it
        is sized)."""
        if dim_class == 256 and q.dtype == "float32" and not interpreter_requested():
            return FLOAT32_256  # every kernel and feature
        if tuned:
            half = q.dtype != "float32"
            chosen = measured_choice(kind, dim_class, opts.causal, Tq, Tk, ranged, splits, half, capped)
            # Float32 never autotunes: its products run on FMA units (IEEE),
            # where the sweep's large tiles only spill, and compiling every
            # candidate made a first float32 call at head dim 64 take minutes
            # (jax-triton compiles them all too).  It takes the features' config.
            if chosen is not None or q.dtype != "float32":
                return chosen
        return table[dim_class][min(fixed, len(table[dim_class]) - 1)]

    def kernel_and_grid(kind, table, rows, programs, ranged=ranged, splits=1):
        """``(kernel, grid, consts, num_warps, num_stages, maxnreg)`` of a
        ``kind = (name, block name)`` launch over ``rows`` in blocks and
        ``programs`` on the other axis; ``consts``: its tile (none when
        autotuned) and launch order (``ORDER``, flash_configs.program_order)."""
        chosen = config(kind[0], table, ranged, splits)
        # Autotuned, the order must fit the smallest candidate's blocks.
        tiles = [chosen] if chosen is not None else CONFIGS[kind[0]][dim_class]
        most = cdiv(rows, min(unpack(c)[kind[1] == "BN"] for c in tiles))
        order = program_order(kind[0], opts.causal, opts.window is not None, ranged, most, programs, HQ // H)
        if chosen is None:
            grid = lambda meta: program_grid(cdiv(rows, meta[kind[1]]), programs, order)  # noqa: E731
            kernel = tuned_kernel(kind[0], dim_class, length_class(max(Tq, Tk)))
            return kernel, grid, {"ORDER": order, "EDGE_STAGES": 0}, None, None, None
        bm, bn, w, s, cap = unpack(chosen)
        block = {"BM": bm, "BN": bn}
        grid = program_grid(cdiv(rows, block[kind[1]]), programs, order)
        edge = edge_stages(kind[0], dim_class, ranged, (bm, bn, w, s))
        return KERNELS[kind[0]], grid, {**block, "ORDER": order, "EDGE_STAGES": edge}, w, s, cap

    index_inputs = (
        In("qoff"),
        In("koff"),
        In("q_positions") if explicit else In("qoff"),
        In("kv_positions") if explicit else In("qoff"),
        In(seg_q) if has_seg else In("qoff"),
        In(seg_k) if has_seg else In("qoff"),
        In("q_key_range") if has_range else In("qoff"),
        In("kv_query_range") if has_range else In("qoff"),
    )
    scalars = (
        (opts.scale, 1.0 if opts.cap is None else opts.cap),  # scale_cap
        (left, right),  # window
        Tq,
        Tk,
        opts.q_chunk or Tq,
        opts.k_chunk or Tk,
        HQ // H,
    )
    aux_strides = (
        pos_q[0],
        pos_k[0],
        _strides_or_zero(seg_info_q, 2)[0],
        _strides_or_zero(seg_info_k, 2)[0],
        *_strides_or_zero(bias, 4),
    )

    kernel, grid, block, w, s, cap = kernel_and_grid(("fwd", "BM"), FWD_CONFIGS, Tq, B * HQ)
    n_sink = 1 if sink is None else (sink.shape[1] if sink.ndim == 2 else 1)
    forward = LaunchPlan(
        kernel=kernel,
        grid=grid,
        params=(
            In("q"),
            In("k"),
            In("v"),
            *index_inputs,
            In("softmax_aux") if sink is not None else In("q"),
            In("bias") if bias is not None else In("q"),
            *scalars,
            HQ,
            n_sink,
            # Each tensor's strides as one argument (a tuple).
            tuple(q.strides),
            tuple(k.strides),
            tuple(v.strides),
            (*aux_strides, n_sink),
            In("q"),  # OUT_IN, LSE_IN: see gated_pair
            In("q"),
        ),
        outputs=(
            OutputSpec((B, Tq, HQ, DV), out_dtype or q.dtype),
            OutputSpec((B, HQ, Tq), "float32"),
        ),
        output_names=("out", "lse"),
        constexprs=dict(
            common,
            BS=max(2, next_power_of_2(n_sink)),
            HAS_SINK=sink is not None,
            DIV16=stride_hint_bits(q, k, v),
            **block,
        ),
        num_warps=w,
        num_stages=s,
        maxnreg=cap,
    )
    # The ring's blocks (position offsets other than 0) keep the main kernel.
    like_plain = tuned and tuple(qoff) == (0,) and tuple(koff) == (0,)  # but for segment ids
    plain = like_plain and not has_seg
    special = ws_forward(q, k, v, opts, sink, out_dtype, plain, n_sink, n_sink)
    if special:
        forward = (special,)
    elif ranged:
        # Plain but for the ids: plain attention's own forward for the rows
        # that see every key (the warp-specialised one where it takes them).
        ids = (seg_q, seg_k, aux_strides[2], aux_strides[3]) if has_seg else None
        ws = ws_forward(q, k, v, opts, sink, out_dtype, like_plain, n_sink, n_sink, "q_key_range", ids)
        if ws is not None and ws.constexprs.get("RANGED"):
            forward = (ws,)  # the persistent Gluon forward takes the ids itself
        else:
            forward = gated_pair(forward, ws, kernel_and_grid(("fwd", "BM"), FWD_CONFIGS, Tq, B * HQ, False))
    else:
        forward = (forward,)

    # Inputs and scalars of every gradient launch, in kernel order.
    grad_params = (
        In("q"),
        In("k"),
        In("v"),
        In("do"),
        In("lse"),
        In("delta"),
        *index_inputs,
        In("bias") if bias is not None else In("q"),
        *scalars,
    )
    # The Gluon backward for the calls the Gluon forward could take at head
    # dim 128 (gluon_backward: it has no other config), as the first
    # launches of gated pairs where the forward's is one.
    hopper = functools.partial(
        gluon_backward, q, k, v, opts, like_plain if ranged else plain, sink, out_dtype, grad_dtype, ranged
    )
    shared = GradShared(q, k, v, bias, common, grad_params, aux_strides, grad_dtype, config,
                        kernel_and_grid, gated_pair if ranged else None, hopper)  # fmt: skip
    grads, dbias = backward_plans(shared)
    return AttentionPlans(forward, grads, dbias, tuple(qoff), tuple(koff))


@cached_checks(maxsize=1024)
def plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
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
    q_key_range: TensorInfo | None = None,
    kv_query_range: TensorInfo | None = None,
) -> tuple[AttentionPlans, bool]:
    """Check the arguments of ``flash_attention`` and plan its launches;
    returns ``(plans, return_lse)``.  With explicit positions, a missing one
    of ``q_positions``/``kv_positions`` is ``arange(T)`` (the bindings make
    it; see :func:`missing_positions`).  Calls with the same arguments share
    one result (the checks cost host time on every eager call)."""
    opts, return_lse = validate(
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
    )
    if opts.positions == "explicit":
        # The missing side becomes a [T] arange (batch stride 0).
        Tq, Tk = query.shape[1], key.shape[1]
        q_positions = q_positions or TensorInfo((Tq,), "int32", (1,))
        kv_positions = kv_positions or TensorInfo((Tk,), "int32", (1,))
    return (
        attention_plans(
            query,
            key,
            value,
            opts,
            q_segment_ids,
            kv_segment_ids,
            softmax_aux,
            bias,
            q_positions,
            kv_positions,
            has_range=q_key_range is not None and kv_query_range is not None,
        ),
        return_lse,
    )
