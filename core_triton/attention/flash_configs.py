"""Flash attention's tile configs: which ``(BM, BN, num_warps,
num_stages)`` each kernel runs with, autotuned or measured
(core_triton.attention.flash plans the launches with them)."""

from __future__ import annotations

import functools

import triton

from core_triton.attention.flash_bwd import flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
from core_triton.attention.flash_common import HINTED
from core_triton.attention.flash_fwd import flash_fwd_kernel
from core_triton.common.launch import TensorInfo
from core_triton.common.runtime import autotune, interpreter_requested
from core_triton.common.utils import next_power_of_2

# (BM, BN, num_warps, num_stages[, maxnreg]).  The first config of each list is what the
# interpreter runs (small blocks: several blocks per test sequence), and is
# valid on a GPU too.  BM: query rows per block; BN: key rows per block.
FWD_CONFIGS = {
    # Head dim 64's last: 8 warps capped at 128 registers (flash_configs'
    # _measured_64; a fifth element is LaunchPlan.maxnreg).
    64: [
        (32, 32, 4, 1),
        (128, 64, 4, 3),
        (128, 128, 4, 3),
        (128, 128, 8, 3),
        (64, 64, 4, 4),
        (128, 64, 8, 3, 128),
    ],
    128: [(32, 32, 4, 1), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)],
    256: [(32, 32, 4, 1), (64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3)],
}
DKDV_CONFIGS = {
    # Head dim 64: 32x128/8w and 32x64/4w compiled without spills on sm_90
    # where 32x128/4w and 64x64/4w spilled about 480 bytes (the split kernel
    # at B1 T4k, 32 query heads on 4; with one head a program a constant,
    # SPLIT 2, Triton 3.6: 32x64/4w 164 registers, 32x128/4w 32 bytes of
    # stack); index 4 stays the features' config (FIXED).
    64: [(32, 32, 4, 1), (32, 128, 4, 3), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 3)],
    128: [(32, 32, 4, 1), (32, 128, 4, 3), (64, 128, 8, 2), (64, 64, 4, 3), (32, 64, 4, 3)],
    256: [(32, 32, 4, 1), (32, 64, 4, 2), (64, 64, 8, 2), (16, 64, 4, 2)],
}
DQ_CONFIGS = {
    # Index 4 (the last) stays the features' config (FIXED).
    64: [(32, 32, 4, 1), (128, 32, 4, 3), (128, 64, 8, 3), (128, 64, 8, 3, 128), (64, 64, 4, 3)],
    128: [(32, 32, 4, 1), (128, 32, 4, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3)],
    256: [(32, 32, 4, 1), (64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2)],
}
# Each kind's kernel and candidate tiles ("fwd", "dkdv", "dq").
KERNELS = {"fwd": flash_fwd_kernel, "dkdv": flash_bwd_dkdv_kernel, "dq": flash_bwd_dq_kernel}
CONFIGS = {"fwd": FWD_CONFIGS, "dkdv": DKDV_CONFIGS, "dq": DQ_CONFIGS}
# Features that are rarer get one fixed config (index into the lists above)
# instead of an autotuning sweep: every flag combination would otherwise
# compile and time every config.
FIXED = {64: 4, 128: 4, 256: 1}
# Segment ids tune on their own: their kernels hold a little more in
# registers, and the plain path's pick spilled there (sm_90, head dim 64:
# 28-490 bytes where plain spills 0-110), which cost them 13-22% on the H100.
# GATE too: the plain kernel's half of a gated pair (flash.gated_pair) may
# tune on a call where few of its blocks have work, and its pick must not
# become plain attention's.  ORDER (the launch order, program_order) too: a
# pick timed under one order need not be the best under another.  The head
# dims and options come as the kernels' two constexpr groups
# (flash_common.FWD_GROUPS), so every option keys a pick of its own.
_KEY = ["DIMS", "OPTIONS", "GATE", "ORDER"]
# Head dims of 65-128 (the common case) take a config measured on the H100
# instead of autotuning: bf16, B=4, H=16, T from 1k to 16k, causal or not.
# The first two configs of each sweep were within 2-5% of each other, close
# enough that the autotuner's pick changed from run to run, and from one
# binding to the other (jax-triton tunes with its own timer), which cost up
# to 15% and made the two frameworks' results differ in their last bits.
# A fixed choice gives both bindings the same compiled kernel.  Set
# MEASURED = False before the first call to autotune these dims too (on
# another GPU, say); plans already made are cached as they were.
MEASURED = True


# Head dims of 129-256 likewise, in bf16/fp16: the autotuner's timings on the
# H100 (B4 H16 T1024 and T4096, causal or not; ``python -m bench.probes.flash_sweep``)
# put the same config first in all four cases for each kernel, 1.2-1.4x ahead
# of the next (forward 2.35 ms at T4096 against 2.91; dK/dV 11.4 against 13.1;
# dQ 3.75 against 4.89).  A fixed choice also spares a first call the
# sweep's compiles (about a minute per mask and dtype).
MEASURED_256 = {"fwd": (128, 64, 8, 2), "dkdv": (64, 64, 8, 2), "dq": (128, 32, 8, 2)}
# Float32 inputs at head dims 129-256 multiply on FMA units (IEEE) and keep
# [rows, 256] float32 accumulators that no tile size fits in registers: every
# candidate spills.  The autotuner's larger candidates need so much local
# memory per thread (dK/dV at 32x64, 4 warps: 17 KB, about 4.7 GB reserved
# over the GPU at launch) that a launch on a busy GPU failed with "out of
# memory".  One small config, 8 warps to share the accumulators (3-9 KB of
# stack per thread, compiled for sm_90), for every kernel and feature.
FLOAT32_256 = (32, 32, 8, 1)


def measured_choice(
    kind: str,
    dim_class: int,
    causal: bool,
    Tq: int,
    Tk: int,
    ranged: bool = False,
    splits: int | None = 1,
    half: bool = True,
    capped: bool = True,
):
    """(BM, BN, num_warps, num_stages[, maxnreg]) for ``kind``, or None to
    autotune (maxnreg: a register cap, LaunchPlan.maxnreg).
    ``ranged``: the segment ids' ranged kernel (HAS_RANGE); ``splits``: the
    dK/dV split (flash_bwd_plans; None while it is being sized); ``half``:
    bf16/fp16 inputs; ``capped``: whether a register-capped config may be
    picked (False for the ring's float32 partials, which were not measured
    with one)."""
    if not MEASURED or interpreter_requested():
        return None
    if dim_class == 64:
        return _measured_64(kind, causal, length_class(max(Tq, Tk)), ranged, splits, capped) if half else None
    if dim_class == 256:
        return MEASURED_256[kind]
    # The ranged kernel (segment ids, packed input) keeps the short tiles at
    # every length: its programs cover a segment's keys only, so a block's
    # fixed cost (about 900 of a short program's 4000 instructions a warp
    # at 128 rows: ranges, Q, the runs' set-up) weighs more than plain
    # attention's, and two programs an SM hide it.  H200, bf16, B1 32 query
    # heads on 4, causal, packed equal documents (``python -m
    # bench.probes.ranged_fwd``, the launch alone, us): forward 64x64/4w/3s
    # against 128x64/8w/3s 81 vs 97 (T4k, 64 documents), 150 vs 163 (4k, 4),
    # 422 vs 449 (16k, 64), 1385 vs 1437 (16k, 4), 698 vs 741 (8k, 2); dQ
    # 64x32/4w/3s against 128x64/8w/2s 88 vs 111, 169 vs 191, 368 vs 451,
    # 1596 vs 1704, 822 vs 875.
    if kind == "fwd":  # loops over keys
        return (128, 64, 8, 3) if Tk >= 2048 and not ranged else (64, 64, 4, 3)
    if kind == "dq":  # loops over keys
        return (128, 64, 8, 2) if Tk >= 2048 and not ranged else (64, 32, 4, 3)
    # dK/dV loops over queries: 32x64/4w/3s at every length, split or not.
    # Measured alone on the H100 once its masked runs compared one limit a
    # score (flash_bwd's query_limits; ``python -m bench.probes.dkdv_runs``,
    # bf16, us): B1 T4k 32 query heads on 4, causal, split 695 against 929
    # for 64x128/8w/2s (the pick before, at causal T >= 4096: 778 then);
    # B4 H16 T8k causal 4719 (before, 64x128/8w/2s: 5818-5865), full 9292
    # (11729-11776); B16 H16 T2k causal 1386 (1734-1738).
    return (32, 64, 4, 3)


# (kind, dim class, tiles) -> stages of edge_stages' rule; probes may add
# or change entries (then flash.replan()).
EDGE_STAGES = {
    ("fwd", 128, (64, 64, 4, 3)): 2,
    ("dq", 64, (64, 64, 4, 3)): 2,
    ("dkdv", 64, (32, 64, 4, 3)): 2,
}


def edge_stages(kind: str, dim_class: int, ranged: bool, tiles: tuple) -> int:
    """The stages of the ranged ``kind`` kernel's masked runs (its
    ``EDGE_STAGES``; 0: the launch's own) for its ``tiles = (BM, BN,
    num_warps, num_stages)``.  Those runs are a segment's edge tiles, one or
    two a block, whose pipeline set-up (and registers: 255 and 32 bytes of
    spills at head dim 128, none with 2 stages; sm_90, offline) weighs more
    than its overlap.  H200, bf16, B1 32 query heads on 4, causal, the
    launch alone (``python -m bench.probes.ranged_fwd plan``, us), head dim
    128 at 64x64/4w/3s, 3 stages against 2: packed equal documents T4k 64
    docs 81 vs 65, 4 docs 150 vs 138, 16k 64 docs 407-433 vs 297, 16k 4 docs
    1496 vs 1289, 8k 2 docs 718 vs 668; unsorted ids (every tile masked) 8k
    1737-1757 vs 1671.  One stage lost there (1980); head dim 64 (128x64/4w/3s)
    lost with either (40.4 vs 41.5 and 45.8 at 4k 64 docs; unsorted 8k 982
    vs 1037 and 1367).  The backward (``bench.probes.ranged_fwd edge``, the
    launch's stages / 1 / 2): head dim 64's dQ at 64x64/4w/3s 62.3 / 51.8 /
    55.9 (4k, 64 docs), 109.4 / 96.6 / 100.5 (4k, 4 docs), unsorted 8k
    1338 / 1600 / 1294; its dK/dV at 32x64/4w/3s 65.6 / 50.7 / 54.9 and
    185.1 / 147.5 / 152.3 (unsorted ids ran other tiles): 2 stages, which
    lost nowhere, where 1 lost 20% on unsorted ids.  Head dim 128's dQ and
    dK/dV moved by 2-5% either way (2 stages: dQ unsorted 1759 -> 1874),
    so they keep their own."""
    return EDGE_STAGES.get((kind, dim_class, tuple(tiles)), 0) if ranged else 0


# Head dims up to 64 in bf16/fp16: the PyTorch autotuner's own timings on
# the H100 (every candidate of DKDV/FWD/DQ_CONFIGS[64], one sweep per
# autotuning key; B1 32 query heads on 4 at T 2k, 4k, 16k causal, T4k full,
# 4 documents of segment ids at 4k and 16k; B4 H16 T1k and 8k and B16 H16
# T2k, causal or not; ``python -m bench.probes.tile_sweep``).  Each rule
# below is the autotuner's pick at every shape measured, with the
# runner-up's time relative to it (the register-cap measurements further
# down changed the forward, full dQ and unsplit dK/dV from 2k on):
# - forward: 64x64/4w/4s causal below 16k (128x64/4w/3s 1.006-1.15x);
#   128x64/4w/3s causal at 16k (64x64 1.02x), full (runner-up 1.03-1.08x)
#   and ranged (64x64 1.11-1.14x);
# - dK/dV: 32x128/4w/3s (next 1.02-1.17x) but causal at 1k: 64x64/4w/3s
#   (32x64 1.10x); causal at 2k split among the group: 32x64/4w/3s
#   (32x128 1.11x; unsplit, 32x128 leads by 1.05x); ranged up to 4k:
#   32x64/4w/3s (32x128 1.09x; at 16k 32x128 leads by 1.10x);
#   causal at 4k split among the group, since a share of one query head is
#   a constant (flash_bwd_dkdv_kernel's SPLIT 2; bench.probes.dkdv_runs,
#   the launch alone, B1 32 query heads on 4, two runs): 32x64/4w/3s 364 us
#   against 400-402 for 32x128 (before that change: 426 / 437);
# - dQ: 64x64/4w/3s everywhere (next 1.03-1.34x).
# Why fixed: jax-triton autotunes on its own (its picks, and so its times,
# differed from PyTorch's); its autotuned custom calls carry every
# candidate's kernel (0.7-0.9 MB of backend config against 0.12-0.17 for
# one, looked up by jaxlib on every call), and a host-bound segment-ids
# forward (B1 T128) took 176 us a call at head dim 64 against 92 at 96,
# whose tiles were fixed (PyTorch: 175 against 128); and a first call paid
# the sweep's compiles.  Both bindings now launch the same kernels.
# Register caps (PTX .maxnreg; LaunchPlan.maxnreg), H200, bf16, each launch
# timed alone beside the plan's (``python -m bench.probes.reg_cap``, us).
# Triton gives the 8-warp 128x64 forward 167 registers (one program an SM)
# where 128 fit without spilling (two; Triton 3.6, sm_90, offline):
# - forward 128x64/8w/3s capped at 128, against the tiles before: B4 H16 T8k
#   causal 1426 vs 1538 (64x64/4w/4s), full 2646 vs 2726 (128x64/4w/3s);
#   B16 H16 T2k causal 430 vs 457, full 725 vs 739.  At the Llama shape (B1
#   T4k, 32 query heads on 4, causal) 220 vs 216: causal at 4k keeps 64x64.
# - dQ 128x64/8w/3s capped at 128 (no spill): full B4 T8k 2755 vs 3006
#   (64x64/4w/3s), B16 T2k 751 vs 807; causal it lost or tied (Llama 246
#   vs 217, B16 T2k 508 vs 485, B4 T8k 1604 vs 1608).
# - 4-warp kernels capped at 128 (four programs an SM instead of three)
#   lost everywhere: forward 64x64/4w/4s, dQ 64x64/4w/3s (16 bytes of spill).
# - dK/dV unsplit: 32x64/4w/3s beat 32x128/4w/3s (152 bytes of stack) at
#   B4 H16 T8k causal 2633 vs 2661, full 5089 vs 5129, B16 H16 T2k causal
#   750 vs 792, full 1311 vs 1358, and B8 T4k 32 query heads on 4 causal
#   3223 vs 3288; capping it at 128 (48-72 bytes of spill) won at one of
#   the four shapes and lost at two.
# Lengths of 1k and below keep the tiles before (not measured), and so does
# the ring (``capped`` False: its float32 partials were not measured with a
# cap, and a capped plan would put its JAX launches on another path).
def _measured_64(kind: str, causal: bool, length: int, ranged: bool, splits: int | None, capped: bool):
    cap = capped and not ranged and length >= 2048
    if kind == "dq":
        return (128, 64, 8, 3, 128) if cap and not causal else (64, 64, 4, 3)
    if kind == "fwd":
        if cap and not (causal and length == 4096):
            return (128, 64, 8, 3, 128)
        return (64, 64, 4, 4) if causal and not ranged and length < 16384 else (128, 64, 4, 3)
    if splits is None:
        return None  # sized on 64 keys a block, as when autotuned (flash_bwd_plans)
    if ranged:
        return (32, 64, 4, 3) if length <= 4096 else (32, 128, 4, 3)
    if causal and length <= 1024:
        return (64, 64, 4, 3)
    if (splits == 1 and length >= 2048) or (causal and length <= 4096):
        return (32, 64, 4, 3)
    return (32, 128, 4, 3)


# dK/dV's programs: one per (key block, batch, key head), each walking every
# query head of its group.  One sequence with few key heads (a Llama-shaped
# B1 T4k, 32 query heads on 4) gives a few hundred programs of very unequal
# work (causal: the first key block sees every query), 2 an SM in one wave,
# and the SM that drew the longest pair sets the time.  Below
# DKDV_SPLIT_BELOW programs an SM the group is split among enough programs
# per key block to make DKDV_PROGRAMS_PER_SM (flash_bwd_dkdv_kernel's
# ``splits``), whose float32 partials one more launch adds up.  Measured
# (H200, bf16, B1, 32 on 4 heads, causal, forward+backward ms for splits
# 1 / 2 / 4 / 8, ``python -m bench.probes.dkdv_splits``): T4k D64 1.159 /
# 1.027 / 0.942 / 0.904; T16k D64 11.55 / 11.63 / 11.40 / 11.35; T4k D128
# 2.032 / 1.831 / 1.671 / 1.620.  Unsplit those are 256, 1024 and 128
# programs, all below 8 an SM; 32 an SM takes 8 at all three.  The
# partials' memory is at most a float32 [B, Tk, HQ, D + DV] (what
# FlashAttention-2 allocates for grouped heads, in bf16): 268 MB at B1 T16k
# D64, 32 on 4 heads.  Fuller grids (several sequences, more key heads) were
# not measured and keep one program a key block.  DKDV_SPLITS: a fixed split (a divisor of every
# group it meets) instead, for tests and probes; None: the rule.
#
# The split also bounds how many query rows one float32 accumulator sums.
# On the H200 the error of dK and dV grows with that count, linearly (the
# tensor cores' accumulation, not the kernels' indexing): B1, 128 keys, 16
# query heads, head dim 128, bf16, against float64 (rms ratio, dK): 1.1M
# queries on 16 key heads (1.1M rows a program) 2.70e-3, on 2 key heads
# unsplit (8.9M rows) 1.07e-2 in both our Triton and our Gluon kernel, 2.72e-3
# split; 2.37e-3 at 16k queries, what rounding P and dS to bf16 gives.
# SDPA's cuDNN back end read 5.3e-2 at 1.1M rows, FlashAttention-2 2.7e-3
# (40th session; docs/design.md).  DKDV_ROWS_MAX rows a program keeps the
# accumulation's share under about 5e-3 (1.3e-3 per 1.1M rows); a lower bound
# would cost memory at long sequences: the partials are float32 [splits, B,
# Tk, H, D + DV], 8.6 GB at B1 T1M 32 on 4 heads D128 split in 2, a quarter
# of q, dO, out and dQ.  The bound counts every query of a packed batch or a
# windowed row, which a key block may not see: such calls split early.
DKDV_SPLIT_BELOW = 8
DKDV_PROGRAMS_PER_SM = 32
DKDV_ROWS_MAX = 2**22
DKDV_SPLITS: int | None = None


def dkdv_splits(key_blocks: int, programs: int, group: int, sms: int, rows: int = 0) -> int:
    """How many programs share one key block's query heads: the smallest
    divisor of ``group`` (``group`` itself when none does) that makes
    ``group * rows / splits`` (query rows a program sums; ``rows`` the
    query length) at most ``DKDV_ROWS_MAX`` and, where ``key_blocks *
    programs`` is below ``DKDV_SPLIT_BELOW`` an SM of ``sms``, makes it
    ``DKDV_PROGRAMS_PER_SM`` an SM."""
    if DKDV_SPLITS is not None:
        return DKDV_SPLITS if group % DKDV_SPLITS == 0 else 1
    fills = key_blocks * programs >= DKDV_SPLIT_BELOW * sms
    for splits in range(1, group + 1):
        if group % splits or group * rows > DKDV_ROWS_MAX * splits:
            continue
        if fills or key_blocks * programs * splits >= DKDV_PROGRAMS_PER_SM * sms:
            return splits
    return group


# Which program takes which block (flash_common.block_and_row's ORDER).
# Causal attention's work grows with the query block (block i visits about
# i + 1 key blocks) and shrinks with the key block in dK/dV, but the GPU
# starts programs with axis 0 fastest: under the grid (blocks, B * heads)
# every head's blocks run light to heavy in turn, and the launch ends on a
# mix of heavy and light programs.  Where query heads share key heads
# (HEADS_FIRST_GROUP), causal launches put the heads on axis 0 and start the
# heaviest blocks first, as FlashAttention does: forward and dQ from the
# last query block (ORDER 2), dK/dV from the first key block (ORDER 1).
# Otherwise they keep ORDER 0 (the warp-specialised forward 3, each head's
# last block first, as it always did).  A window makes the blocks' work about equal, and the ranged
# kernel's (segment ranges) follows the sequences, not the index: both keep
# ORDER 0.  CUDA takes up to 65535 programs on axis 1 and 2**31 - 1 on axis
# 0: a launch whose blocks or programs do not fit the transposed grid keeps
# ORDER 0.  PROGRAM_ORDER: one order forced on every launch that fits it
# (tests and probes; flash.set_program_order), None: the rule.
# Heads first pays where neighbouring query heads share their key head: on
# the H200 (bench.probes.reg_cap, launch alone) B1 T4k 32 query heads on 4,
# causal, head dim 64: forward 216 -> 191 us, dQ 219 -> 198, dK/dV 368 ->
# 329; head dim 128 dQ 452 -> 417 (dK/dV 620 -> 633).  Without shared heads
# it lost (each wave reads every head's keys, not a few heads'): B4 T8k 16
# heads on 16, head dim 64, forward 1418 -> 1547, dQ 1600 -> 1682; B16 T2k
# dQ 487 -> 598, dK/dV 739 -> 825; head dim 128 B4 T8k dQ 3184 -> 3708.
HEADS_FIRST_GROUP = 4
GRID_Y_MAX = 65535
GRID_X_MAX = 2**31 - 1
PROGRAM_ORDER: int | None = None


def program_order(
    kind: str,
    causal: bool,
    window: bool,
    ranged: bool,
    blocks: int,
    programs: int,
    group: int = 1,
    flip: bool = False,
) -> int:
    """The launch order (flash_common.block_and_row) of a ``kind`` launch
    ("fwd", "dq", "dkdv"), for causal attention without a window outside
    the ranged kernel (``ranged``): heads first, 2 (forward, dQ) or 1
    (dK/dV), where ``group`` query heads (at least HEADS_FIRST_GROUP) share
    a key head; else 3 for a forward that flipped its own blocks before
    (``flip``: the warp-specialised one), 0 for the rest.  0 wherever
    ``blocks`` (along the sequence; for an autotuned launch, its smallest
    tile's count) or ``programs`` (batch * heads [* splits]) would not fit
    the transposed grid; 1 or 2 (transposed) wherever ``programs`` is more
    than axis 1 takes (GRID_Y_MAX), whatever PROGRAM_ORDER says."""
    fits = blocks <= GRID_Y_MAX and programs <= GRID_X_MAX
    if programs > GRID_Y_MAX and fits:
        # Only the transposed grid holds this many (batch, head) programs
        # (ORDER 0 and 3 put them on axis 1): heaviest causal blocks first
        # where the rule below would take them so.
        heavy_first = causal and not window and not ranged and kind != "dkdv"
        return 2 if heavy_first else 1
    if PROGRAM_ORDER is not None:
        return PROGRAM_ORDER if fits or PROGRAM_ORDER in (0, 3) else 0
    if not causal or window or ranged:
        return 0
    if group >= HEADS_FIRST_GROUP and fits:
        return 1 if kind == "dkdv" else 2
    return 3 if flip and kind == "fwd" else 0


def program_grid(blocks: int, programs: int, order: int) -> tuple[int, int]:
    """The grid of a launch of ``blocks`` blocks along its sequence and
    ``programs`` on the other axis under ``order`` (the layout
    flash_common.block_and_row reads)."""
    return (blocks, programs) if order in (0, 3) else (programs, blocks)


def unpack(config: tuple) -> tuple:
    """``(BM, BN, num_warps, num_stages, maxnreg)`` of a config of the tables
    above (``maxnreg`` None where it has no fifth element)."""
    bm, bn, w, s, *cap = config
    return bm, bn, w, s, (cap[0] if cap else None)


def _configs(table):
    return [
        triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=s, maxnreg=cap)
        for bm, bn, w, s, cap in map(unpack, table)
    ]


# Autotuning keeps one pick per key, and the key names no length: the
# first call's length would choose for every later one (PyTorch's binding:
# a head-dim-64 dK/dV tuned at 4096 tokens in 4 documents ran 16384 tokens
# in 4 documents at 11.8 ms forward+backward, against 5.5 in JAX, whose
# launcher tunes again for new scalars).  Each length class (the longer
# side, rounded up to a power of two, 1k to 64k) has its own autotuner.
_LENGTH_CLASSES = (1024, 65536)


def length_class(n: int) -> int:
    """The autotuning length class of a call whose longer side is ``n``."""
    lo, hi = _LENGTH_CLASSES
    return min(max(next_power_of_2(max(n, 1)), lo), hi)


@functools.cache
def tuned_kernel(kind: str, dim_class: int, length: int):
    """The autotuned ``kind`` kernel ("fwd", "dkdv", "dq") of a head-dim
    class and a :func:`length_class`: one autotuner (and one pick per key)
    each; the compiled kernels are shared."""
    # dK/dV: the split (its programs' count and length) is in the key too.
    key = _KEY + (["splits"] if kind == "dkdv" else [])
    return autotune(configs=_configs(CONFIGS[kind][dim_class]), key=key)(KERNELS[kind])


def dim_class(bd: int) -> int:
    return 64 if bd <= 64 else 128 if bd <= 128 else 256


def stride_hint_bits(
    q: TensorInfo, k: TensorInfo, v: TensorInfo, do: TensorInfo | None = None, o: TensorInfo | None = None
) -> int:
    """A flash kernel's ``DIV16``: bit ``i`` set where the ``i``-th stride
    of flash_common.HINTED (``[B, T, H, D]`` tensors' time, batch and head
    strides) is a multiple of 16 (and not 0 or 1); without ``do`` (the
    forward) or ``o`` (all but the dQ kernel) their bits stay 0."""
    strides = {}
    for name, t in (("q", q), ("k", k), ("v", v), ("do", do), ("o", o)):
        if t is not None:
            strides.update({name + "t": t.strides[1], name + "b": t.strides[0], name + "h": t.strides[2]})
    values = (strides.get(name, 0) for name in HINTED)
    return sum(1 << i for i, s in enumerate(values) if s > 1 and s % 16 == 0)
