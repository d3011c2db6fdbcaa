"""The tensor-descriptor flash kernels: the warp-specialised forwards for
Hopper (flash_fwd_gluon.py, written in Gluon, and flash_fwd_ws.py, Triton's
own pass; on by default on sm_90 GPUs) and the Gluon backward
(flash_bwd_dq_gluon.py, flash_bwd_dkdv_gluon.py), their switches, configs
and launches.  core_triton.attention.flash takes it where it applies
(``flash.set_ws_forward``).  The opt-in descriptor kernels of issue 15
(a forward and a backward that reached no target) were deleted; git
history has them (flash_fwd_tma.py, flash_bwd_tma.py, before commit
"Delete the opt-in tensor-descriptor flash kernels")."""

from __future__ import annotations

import os

from core_triton.attention import (
    flash_bwd_dkdv_gluon,
    flash_bwd_dq_gluon,
    flash_fwd_gluon,
    flash_fwd_gluon_persistent,
)
from core_triton.attention.flash_configs import GRID_Y_MAX, program_grid, program_order
from core_triton.attention.flash_fwd_ws import flash_fwd_ws_kernel
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import cuda_capability, interpreter_requested, multiprocessor_count
from core_triton.common.utils import cdiv, next_power_of_2


def _row_major(info: TensorInfo) -> bool:
    expected, step = [], 1
    for size in reversed(info.shape):
        expected.append(step)
        step *= size
    pairs = zip(info.shape, info.strides, reversed(expected), strict=True)
    return all(n == 1 or st == e for n, st, e in pairs)


# flash_fwd_ws_kernel for the plain and causal forward: "auto" takes it on
# sm_90 GPUs (Hopper), "on" everywhere (the interpreter runs it with small
# blocks, for CI), "off" never (TWINKERNELS_FLASH_WS before import, or
# flash.set_ws_forward).  (BM, BN, num_warps, num_stages) per head dim; the
# warp-specialisation pass adds 8 warps to num_warps.  Head dim 128 only:
# at 64 it ran slower than flash_fwd_kernel on the H100 (B4 T8k 325 against
# 416 TF/s), and three stages gave NaN at either (a miscompile that
# tests/suites/flash_attention.py pins).
WS_FORWARD = os.environ.get("TWINKERNELS_FLASH_WS", "auto")
WS_CONFIGS = {128: (128, 128, 4, 2)}
_WS_INTERPRETED = (32, 16, 4, 1)
# "auto" takes it from this many queries and keys on: at 1024 (B4 H16) it
# ran slower than flash_fwd_kernel's short-sequence tiles (0.139 against
# 0.117 ms), from 2048 on faster.
WS_MIN_LEN = 2048


# flash_fwd_gluon_kernel (Gluon; a producer warp and two consumer warp
# groups) where it applies, before flash_fwd_ws_kernel: "auto" on sm_90
# GPUs from GLUON_MIN_LEN queries and keys on, "on" at every length on a
# GPU, "off" never (TWINKERNELS_FLASH_GLUON before import, or
# flash.set_gluon_forward).  Never under the interpreter: Gluon has none.
# The config per head dim: (BM, BN, num_warps, STAGES, maxnreg); the launch
# runs 12 warps (two consumer groups and the producer's), 168 registers a
# thread leaves the consumers 240.  Measured on the H200 (forward alone,
# TF/s; bench.probes.gluon_flash, 38th session): B4 H16 T8k 599 / 555 full /
# causal (cuDNN 608 / 552), flash_fwd_ws_kernel 531 / 500 before; B16 H16
# T2k 500 / 381 against flash_fwd_ws_kernel's 451 / 369.  Head dim 64 ran
# no faster than flash_fwd_kernel (409 / 367 against 409 / 380 at T8k).
# From 1024 on: at B32 H16 T1k (39th session) it took 641 / 470 us full /
# causal against flash_fwd_kernel's 738 / 482; shorter was not measured.
GLUON_FORWARD = os.environ.get("TWINKERNELS_FLASH_GLUON", "auto")
GLUON_CONFIGS = {128: (128, 128, 4, 3, 168)}
GLUON_MIN_LEN = 1024
# The Gluon forward runs as a persistent kernel (flash_fwd_gluon_persistent:
# one program an SM, the next tile's Q and keys loading while one runs; a
# gated pair's first launch too, its producer handing on the tiles it
# runs), unless
# TWINKERNELS_FLASH_GLUON_PERSISTENT=0 (before import; or
# flash.set_gluon_persistent).  Config per head dim: (BM, BN, num_warps,
# STAGES, maxnreg, QBUFS); two Q buffers leave shared memory for two
# stages at head dim 128.  H200, forward alone, us, one program a tile ->
# persistent, in one process (bench.probes.gluon_flash, 43rd session, the
# tiles dealt in alternating turns, flash_fwd_gluon_persistent._tile; SDPA
# cuDNN in brackets): B4 H16 T8k 3705 -> 3602 full (3699), 2006 -> 1957
# causal (2017); B8 T4k 1970 -> 1847 (1874), 1148 -> 1055 (1065); B16 T2k
# 1104 -> 984 (970), 685 -> 597 (578); B32 T1k 649 -> 522 (509), 468 ->
# 381 (337); B1 T4k 32:4 causal 287 -> 253.  Head dim 64 (which the kernel
# of a program a tile does not take: it ran no faster than
# flash_fwd_kernel): 2468 / 1325 us at B4 T8k full / causal against
# flash_fwd_kernel's 2670 / 1439 and cuDNN's 2410 / 1294 (43rd session).
GLUON_PERSISTENT = os.environ.get("TWINKERNELS_FLASH_GLUON_PERSISTENT", "1") != "0"
# Segment ids (and packed rows) through the persistent kernel alone
# (``RANGED``, flash_fwd_gluon_ranged: it reads the ranges and compares
# ids itself), where a gated pair takes it as its first launch and the
# ranged Triton kernel as its second: TWINKERNELS_FLASH_GLUON_RANGED=1
# before import, or flash.set_gluon_ranged(True).  Off by default: on the
# H200 (45th session, B1 T4k 32:4 causal, us a call, ranges kept; alone
# against the pair) documents ran faster, 4 of 1k tokens 117.9 against
# 155.8 (head dim 128), 64 of 64 74.8 against 102.8 (head dim 64), but one
# segment slower, 197.9 against 185.8 (64) and 255.1 against 247.0 (128;
# plain 176.4, 236.8), 9% at T16k, and one segment is the common case.
GLUON_RANGED = os.environ.get("TWINKERNELS_FLASH_GLUON_RANGED", "0") == "1"
GLUON_PERSISTENT_CONFIGS = {128: (128, 128, 4, 2, 168, 2), 64: (128, 128, 4, 2, 168, 2)}
# Without a mask (no causal mask, no segment ids or packed rows) at head
# dim 64, from GLUON_FULL_MIN_LEN queries and keys on: three consumer
# groups (FlashAttention-3's split there: ``GROUPS`` 3, 192 query rows a
# tile, 160 registers a thread in two groups and 168 in the first, 16
# warps at maxnreg 128), which
# hide more of the softmax, relatively heavier at 64 than at 128.  (BM,
# BN, num_warps, STAGES, maxnreg, QBUFS, GROUPS).  H200, forward alone,
# us, two groups -> three (bench.probes.gluon_flash, 46th session; SDPA
# cuDNN in brackets): B4 H16 T8k 2508 -> 2338 (2434), B8 T4k 1287 -> 1248
# (1219), B16 T2k 664 -> 637 (633); three stages: 2381, 1272, 646.  A
# causal tile of 192 rows would cross two key blocks' diagonals (the kernel
# masks the last block only).
GLUON_PERSISTENT_FULL_CONFIGS = {64: (192, 128, 4, 2, 128, 2, 3)}
GLUON_FULL_MIN_LEN = 2048

# The Gluon backward (flash_bwd_dq_gluon, flash_bwd_dkdv_gluon) for the
# kind of call the Gluon forward takes (gluon_backward), without an lse
# cotangent for dQ; its own switch and lengths (TWINKERNELS_FLASH_GLUON_BWD
# before import, or flash.set_gluon_backward).  Configs per head dim, (BM, BN, num_warps,
# STAGES, maxnreg).  H200, B4 H16 T8k D128 full / causal, us
# (bench.probes.gluon_bwd, 39th session): dQ 4773 / 2534 against
# flash_bwd_dq_kernel's 6134 / 3149, at B16 T2k 1399 / 876 against 1804 /
# 1084, at B1 T4k 32:4 causal 366 against 422; dK/dV 7437 / 4305 against
# 8738 / 4492, at B16 T2k 2193 / 1353 against 2321 / 1335.  So dK/dV
# causal from GLUON_DKDV_CAUSAL_MIN_LEN keys on, and only where
# flash_bwd_dkdv_kernel's plan would not split a key block's query-head
# group over several programs (flash_configs.dkdv_splits, few key blocks
# and heads): at B1 T4k 32:4, 128 programs of 8 query heads each, it took
# 924 us against the split's 615.  With segment ids (or packed rows) they are
# the first launches of the backward's gated pairs (flash.gated_pair), as
# the Gluon forward is of the forward's.
GLUON_BACKWARD = os.environ.get("TWINKERNELS_FLASH_GLUON_BWD", "auto")
GLUON_DQ_CONFIGS = {128: (128, 128, 4, 2, 168)}
GLUON_DKDV_CONFIGS = {128: (64, 128, 4, 2, 168)}
GLUON_BWD_MIN_LEN = 2048
GLUON_DKDV_CAUSAL_MIN_LEN = 4096
# The Gluon kernels put (batch, head) on the grid's second axis, where CUDA
# takes at most GRID_Y_MAX programs: past it the plan keeps the Triton
# kernels (whose grids are transposed there, flash_configs.program_order).


def _switched_on(mode: str, min_len: int, Tq: int, Tk: int) -> bool:
    """A Hopper kernel's switch: "auto" takes it on an sm_90 GPU from
    ``min_len`` queries and keys on, "on" everywhere, "off" never."""
    if mode == "auto":
        return not interpreter_requested() and cuda_capability() == 90 and min(Tq, Tk) >= min_len
    return mode == "on"


def _gluon_wanted(mode: str, min_len: int, Tq: int, Tk: int) -> bool:
    """A Gluon kernel's switch (_switched_on), but never under the
    interpreter or without Gluon."""
    if flash_fwd_gluon.flash_fwd_gluon_kernel is None or interpreter_requested():
        return False
    return _switched_on(mode, min_len, Tq, Tk)


def _gluon_forward(q, k, v, opts, gate_range=None, segments=None) -> LaunchPlan:
    """The forward through flash_fwd_gluon_kernel (parameters ``q, k, v``,
    the queries' ranges or a placeholder, scale, sizes; outputs ``out,
    lse``); ``gate_range`` and ``segments`` as ws_forward's.  The
    persistent kernel where GLUON_PERSISTENT has a config (one program an
    SM, or a tile, whichever is fewer), else a program a tile."""
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    inputs = (In("q"), In("k"), In("v"), In(gate_range or "q"))
    if _persistent(D):
        bm, bn, w, stages, cap, qbufs = GLUON_PERSISTENT_CONFIGS[D]
        extra = dict(QBUFS=qbufs, GROUPS=2)
        if _three_groups(D, opts, gate_range, Tq, Tk):
            bm, bn, w, stages, cap, qbufs, groups = GLUON_PERSISTENT_FULL_CONFIGS[D]
            extra = dict(QBUFS=qbufs, GROUPS=groups)
        kernel = flash_fwd_gluon_persistent.flash_fwd_gluon_kernel
        grid = (min(cdiv(Tq, bm) * B * HQ, multiprocessor_count()),)
        ids = (In("q"), In("q"), 0, 0)  # the ids and their batch strides
        if gate_range and segments and GLUON_RANGED:
            ids = (In(segments[0]), In(segments[1]), *segments[2:])
            extra["RANGED"] = True
        params = (*inputs, *ids, opts.scale, B, Tq, Tk)
    else:
        bm, bn, w, stages, cap = GLUON_CONFIGS[D]
        kernel = flash_fwd_gluon.flash_fwd_gluon_kernel
        grid = (cdiv(Tq, bm), B * HQ)
        extra = {}
        params = (*inputs, opts.scale, B, Tq, Tk)
    return LaunchPlan(
        kernel=kernel,
        grid=grid,
        params=params,
        outputs=(OutputSpec((B, Tq, HQ, D), q.dtype), OutputSpec((B, HQ, Tq), "float32")),
        output_names=("out", "lse"),
        constexprs=dict(HQ=HQ, H=H, D=D, CAUSAL=opts.causal, BM=bm, BN=bn, STAGES=stages)
        | dict(GATE=1 if gate_range and "RANGED" not in extra else 0, **extra),
        num_warps=w,
        maxnreg=cap,
    )


def _three_groups(D: int, opts, gate_range, Tq: int, Tk: int) -> bool:
    """Whether the persistent forward runs three consumer groups
    (GLUON_PERSISTENT_FULL_CONFIGS): no mask at all, long enough."""
    return (
        D in GLUON_PERSISTENT_FULL_CONFIGS
        and not opts.causal
        and gate_range is None
        and min(Tq, Tk) >= GLUON_FULL_MIN_LEN
    )


def _persistent(D: int) -> bool:
    """Whether the Gluon forward runs persistent at head dim ``D``."""
    return GLUON_PERSISTENT and D in GLUON_PERSISTENT_CONFIGS


def _applies(q, k, v, opts, plain, out_dtype) -> bool:
    """What the warp-specialised kernels take (core_triton.attention.
    flash_fwd_ws, flash_fwd_gluon; each has its own head dims)."""
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    return (
        plain
        and opts.q_pieces == 1
        and opts.k_pieces == 1
        and opts.q_chunk in (0, Tq)  # one piece of positions 0..T-1
        and opts.k_chunk in (0, Tk)
        and q.dtype in ("bfloat16", "float16")
        and q.dtype == k.dtype == v.dtype
        and (out_dtype or q.dtype) == q.dtype
        and D == v.shape[3]
        and Tq >= 1
        and Tk >= 1
        and all(_row_major(t) for t in (q, k, v))
    )


def ws_forward(
    q, k, v, opts, sink, out_dtype, plain, n_sink, sink_stride, gate_range=None, segments=None
) -> LaunchPlan | None:
    """The forward through flash_fwd_gluon_kernel where it applies (see
    _gluon_forward; no sinks), else through
    flash_fwd_ws_kernel (parameters ``q, k, v``, the
    sinks and the queries' ranges or placeholders, scale, sizes, sink count
    and stride; outputs ``out, lse``), or None where it does not apply (see
    core_triton.attention.flash_fwd_ws).  ``gate_range``: the name of the
    queries' ranges, for the first launch of a gated pair
    (flash.gated_pair; ``plain`` then says the call is plain but for its
    segment ids).  ``segments``: with ``gate_range``, the names of the
    queries' and keys' ids and their batch strides, for the persistent
    Gluon forward to take the whole call alone (``RANGED``, GLUON_RANGED;
    the plan's ``constexprs`` say so), not as a pair's first launch."""
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    if not _applies(q, k, v, opts, plain, out_dtype):
        return None
    gluon = _gluon_wanted(GLUON_FORWARD, GLUON_MIN_LEN, Tq, Tk)
    tiled = D in GLUON_CONFIGS and B * HQ <= GRID_Y_MAX
    if gluon and sink is None and (_persistent(D) or tiled):
        return _gluon_forward(q, k, v, opts, gate_range, segments)
    if D not in WS_CONFIGS or not _switched_on(WS_FORWARD, WS_MIN_LEN, Tq, Tk):
        return None
    bm, bn, w, s = _WS_INTERPRETED if interpreter_requested() else WS_CONFIGS[D]
    if B > 1 and Tk % bn:
        # A key block would cross into the next batch (flash_fwd_ws).
        return None
    # The first launch of a gated pair is plain attention's: its order too.
    window = opts.window is not None
    order = program_order("fwd", opts.causal, window, False, cdiv(Tq, bm), B * HQ, HQ // H, flip=True)
    return LaunchPlan(
        kernel=flash_fwd_ws_kernel,
        grid=program_grid(cdiv(Tq, bm), B * HQ, order),
        params=(
            In("q"),
            In("k"),
            In("v"),
            In("softmax_aux") if sink is not None else In("q"),
            In(gate_range or "q"),
            opts.scale,
            B,
            Tq,
            Tk,
            HQ,
            H,
            n_sink,
            sink_stride,
        ),
        outputs=(OutputSpec((B, Tq, HQ, D), q.dtype), OutputSpec((B, HQ, Tq), "float32")),
        output_names=("out", "lse"),
        constexprs=dict(
            D=D,
            BS=max(2, next_power_of_2(n_sink)),
            CAUSAL=opts.causal,
            HAS_SINK=sink is not None,
            BM=bm,
            BN=bn,
            GATE=1 if gate_range else 0,
            ORDER=order,
        ),
        num_warps=w,
        num_stages=s,
    )


def gluon_backward(q, k, v, opts, plain, sink, out_dtype, grad_dtype, gated, do, o, dlse, splits):
    """``(dkdv, dq)``: the Gluon backward's launches where they apply, each
    a LaunchPlan or None (the plan's Triton kernels then).  Where the Gluon
    forward could run at head dim 128 (plain or causal, half precision, row-
    major, no sinks, outputs and gradients in the inputs' dtype; at head
    dim 64 the forward is Gluon's, the backward Triton's) and the
    cotangent ``do`` and output ``o`` are row-major in that dtype, on the
    switch's lengths.  dQ: ``q, k, v, o, do, lse`` -> ``dq, delta`` (none
    with an ``lse`` cotangent, ``dlse``); dK/dV: ``q, k, v, do, lse,
    delta`` -> ``dk, dv``, with GLUON_BACKWARD "auto" only where the
    Triton kernel would not split its query-head group (``splits``, its
    plan's: 1 where it does not; see above).  ``gated``: the launches are
    the first of gated pairs (flash.gated_pair; ``plain`` then says the
    call is plain but for its segment ids), gated by the ranges
    ``q_key_range`` (dQ) and ``kv_query_range`` (dK/dV), and dK/dV only
    unsplit (the pair's ranged launch then writes ``dk, dv`` too)."""
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    if (
        sink is not None
        or grad_dtype not in (None, q.dtype)
        or D not in GLUON_DQ_CONFIGS
        or D not in GLUON_DKDV_CONFIGS
        or B * HQ > GRID_Y_MAX
        or not _applies(q, k, v, opts, plain, out_dtype)
        or not all(t.dtype == q.dtype and _row_major(t) for t in (do, o))
        or not _gluon_wanted(GLUON_BACKWARD, GLUON_BWD_MIN_LEN, Tq, Tk)
    ):
        return None, None
    common = dict(HQ=HQ, H=H, D=D, CAUSAL=opts.causal, GATE=1 if gated else 0)
    dq = None
    if not dlse:
        bm, bn, w, stages, cap = GLUON_DQ_CONFIGS[D]
        gate = In("q_key_range") if gated else In("q")
        dq = LaunchPlan(
            kernel=flash_bwd_dq_gluon.flash_bwd_dq_gluon_kernel,
            grid=(cdiv(Tq, bm), B * HQ),
            params=(In("q"), In("k"), In("v"), In("o"), In("do"), In("lse"), gate, opts.scale, B, Tq, Tk),
            outputs=(OutputSpec((B, Tq, HQ, D), q.dtype), OutputSpec((B, HQ, Tq), "float32")),
            output_names=("dq", "delta"),
            constexprs=dict(common, BM=bm, BN=bn, STAGES=stages),
            num_warps=w,
            maxnreg=cap,
        )
    bm, bn, w, stages, cap = GLUON_DKDV_CONFIGS[D]
    auto = GLUON_BACKWARD == "auto"
    if (auto and opts.causal and min(Tq, Tk) < GLUON_DKDV_CAUSAL_MIN_LEN) or ((auto or gated) and splits > 1):
        return None, dq
    gate = In("kv_query_range") if gated else In("q")
    dkdv = LaunchPlan(
        kernel=flash_bwd_dkdv_gluon.flash_bwd_dkdv_gluon_kernel,
        grid=(cdiv(Tk, bn), B * H),
        params=(In("q"), In("k"), In("v"), In("do"), In("lse"), In("delta"), gate, opts.scale, B, Tq, Tk),
        outputs=(OutputSpec((B, Tk, H, D), q.dtype), OutputSpec((B, Tk, H, D), q.dtype)),
        output_names=("dk", "dv"),
        constexprs=dict(common, BM=bm, BN=bn, STAGES=stages),
        num_warps=w,
        maxnreg=cap,
    )
    return dkdv, dq
