"""``flash_attention``: softmax attention, single device (docs/api.md#flash_attention).

Shapes: ``query [B, Tq, HQ, D]``, ``key [B, Tk, H, D]``, ``value [B, Tk, H,
Dv]`` (``HQ % H == 0``, ``D, Dv <= 256``); ``output [B, Tq, HQ, Dv]`` and
``lse [B, HQ, Tq]`` float32.  Optional: segment ids int32/int64 ``[B, T]``,
positions int32/int64 ``[B, T]`` or ``[T]``, ``softmax_aux`` (sinks) ``[HQ]``
or ``[HQ, S]``, ``bias [B|1, HQ|1, Tq, Tk]``.

Launches (all inputs named as below; absent optional inputs are replaced by
a dummy pointer and a constexpr flag):

* forward: ``flash_fwd_kernel`` -> ``(out, lse)``;
* backward: ``flash_bwd_preprocess_kernel`` (``o``, ``do``) -> ``delta``,
  then ``flash_bwd_dkdv_kernel`` -> ``(dk, dv)`` and
  ``flash_bwd_dq_kernel`` -> ``dq``;
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
"""

from __future__ import annotations

import functools
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass

import triton

from core_triton.attention.flash_bwd import (
    flash_bwd_dbias_kernel,
    flash_bwd_dkdv_kernel,
    flash_bwd_dq_kernel,
    flash_bwd_preprocess_kernel,
)
from core_triton.attention.flash_bwd_tma import flash_bwd_dkdv_tma_kernel, flash_bwd_dq_tma_kernel
from core_triton.attention.flash_common import POS_INF_INT
from core_triton.attention.flash_fwd import flash_fwd_kernel
from core_triton.attention.flash_fwd_tma import flash_fwd_tma_kernel
from core_triton.common import checks
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import autotune, interpreter_requested
from core_triton.common.utils import cached_checks, cdiv, next_power_of_2

MAX_HEAD_DIM = 256
# Windows wider than this are unbounded (positions stay below 2**29).
_MAX_WINDOW = POS_INF_INT // 2

# ---- autotuning -----------------------------------------------------------
# (BM, BN, num_warps, num_stages).  The first config of each list is what the
# interpreter runs (small blocks: several blocks per test sequence), and is
# valid on a GPU too.  BM: query rows per block; BN: key rows per block.
_FWD_CONFIGS = {
    64: [(32, 32, 4, 1), (128, 64, 4, 3), (128, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4)],
    128: [(32, 32, 4, 1), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)],
    256: [(32, 32, 4, 1), (64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3)],
}
_DKDV_CONFIGS = {
    64: [(32, 32, 4, 1), (32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3)],
    128: [(32, 32, 4, 1), (32, 128, 4, 3), (64, 128, 8, 2), (64, 64, 4, 3), (32, 64, 4, 3)],
    256: [(32, 32, 4, 1), (32, 64, 4, 2), (64, 64, 8, 2), (16, 64, 4, 2)],
}
_DQ_CONFIGS = {
    64: [(32, 32, 4, 1), (128, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
    128: [(32, 32, 4, 1), (128, 32, 4, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3)],
    256: [(32, 32, 4, 1), (64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2)],
}
# Features that are rarer get one fixed config (index into the lists above)
# instead of an autotuning sweep: every flag combination would otherwise
# compile and time every config.
_FIXED = {64: 4, 128: 4, 256: 1}
# Segment ids tune on their own: their kernels hold a little more in
# registers, and the plain path's pick spilled there (sm_90, head dim 64:
# 28-490 bytes where plain spills 0-110), which cost them 13-22% on the H100.
_KEY = ["D", "DV", "CAUSAL", "HAS_WINDOW", "HAS_SEG", "HAS_RANGE", "NQP", "NKP", "DOT_PREC"]
# Constexprs of the bias-gradient kernel (it always reads a bias).
_DBIAS_CONSTS = (
    "D",
    "DV",
    "BD",
    "BDV",
    "CAUSAL",
    "HAS_WINDOW",
    "HAS_CAP",
    "HAS_SEG",
    "HAS_RANGE",
    "POS_MODE",
)
_DBIAS_CONSTS += ("NQP", "NKP", "ROW64", "DOT_PREC")


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
_MEASURED_256 = {"fwd": (128, 64, 8, 2), "dkdv": (64, 64, 8, 2), "dq": (128, 32, 8, 2)}
# Float32 inputs at head dims 129-256 multiply on FMA units (IEEE) and keep
# [rows, 256] float32 accumulators that no tile size fits in registers: every
# candidate spills.  The autotuner's larger candidates need so much local
# memory per thread (dK/dV at 32x64, 4 warps: 17 KB, about 4.7 GB reserved
# over the GPU at launch) that a launch on a busy GPU failed with "out of
# memory".  One small config, 8 warps to share the accumulators (3-9 KB of
# stack per thread, compiled for sm_90), for every kernel and feature.
_FLOAT32_256 = (32, 32, 8, 1)


def _measured_choice(kind: str, dim_class: int, causal: bool, Tq: int, Tk: int):
    """(BM, BN, num_warps, num_stages) for ``kind``, or None to autotune."""
    if not MEASURED or dim_class == 64 or interpreter_requested():
        return None
    if dim_class == 256:
        return _MEASURED_256[kind]
    if kind == "fwd":  # loops over keys
        return (128, 64, 8, 3) if Tk >= 2048 else (64, 64, 4, 3)
    if kind == "dq":  # loops over keys
        return (128, 64, 8, 2) if Tk >= 2048 else (64, 32, 4, 3)
    # dK/dV loops over queries; causal at length halves the work per block
    # row, and the larger tile then wins (5.1 ms against 5.6 at T=8192).
    return (64, 128, 8, 2) if causal and Tq >= 4096 else (32, 64, 4, 3)


def _configs(table):
    return [triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in table]


@functools.cache
def _tuned(kind: str, dim_class: int):
    kernel, table = {
        "fwd": (flash_fwd_kernel, _FWD_CONFIGS),
        "dkdv": (flash_bwd_dkdv_kernel, _DKDV_CONFIGS),
        "dq": (flash_bwd_dq_kernel, _DQ_CONFIGS),
    }[kind]
    return autotune(configs=_configs(table[dim_class]), key=_KEY)(kernel)


# ---- the tensor-descriptor forward (issue 15, opt in) ---------------------
# flash_fwd_tma_kernel for the plain and causal forward, when TMA_FORWARD is
# set (TWINKERNELS_FLASH_TMA=1 before import, or set_tma_forward): a candidate
# for Hopper, not the default until the H100 measures it.  (BM, BN,
# num_warps, num_stages) per head dim; the interpreter runs small blocks.
TMA_FORWARD = os.environ.get("TWINKERNELS_FLASH_TMA", "0") == "1"
TMA_CONFIGS = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3)}
_TMA_INTERPRETED = (32, 16, 4, 1)
# The backward kernels of flash_bwd_tma likewise (TWINKERNELS_FLASH_TMA_BWD=1,
# or set_tma_backward): ((BM, BN, warps, stages) of dK/dV, the same of dQ).
# dK/dV walks query blocks of BM for a key block of BN (BN a multiple of BM);
# dQ the other way round.
TMA_BACKWARD = os.environ.get("TWINKERNELS_FLASH_TMA_BWD", "0") == "1"
TMA_BWD_CONFIGS = {64: ((64, 128, 8, 2), (128, 64, 8, 2)), 128: ((64, 128, 8, 2), (128, 64, 8, 2))}
_TMA_BWD_INTERPRETED = ((16, 32, 4, 1), (32, 16, 4, 1))


def set_tma_forward(enabled: bool, configs: dict | None = None) -> None:
    """Turn the tensor-descriptor forward on or off (and set its configs);
    plans made before are dropped, so the next call plans again."""
    global TMA_FORWARD
    TMA_FORWARD = bool(enabled)
    _replan(TMA_CONFIGS, configs)


def set_tma_backward(enabled: bool, configs: dict | None = None) -> None:
    """The same for the tensor-descriptor backward."""
    global TMA_BACKWARD
    TMA_BACKWARD = bool(enabled)
    _replan(TMA_BWD_CONFIGS, configs)


# Counts replans: a binding that keeps plans per call signature (the torch
# binding's eager memo) drops them when this changes.
GENERATION = 0


def _replan(table: dict, configs: dict | None) -> None:
    global GENERATION
    if configs is not None:
        table.update(configs)
    attention_plans.cache_clear()
    plans.cache_clear()
    GENERATION += 1


def _row_major(info: TensorInfo) -> bool:
    expected, step = [], 1
    for size in reversed(info.shape):
        expected.append(step)
        step *= size
    pairs = zip(info.shape, info.strides, reversed(expected), strict=True)
    return all(n == 1 or st == e for n, st, e in pairs)


def _tma_applies(q, k, v, opts, plain, out_dtype) -> bool:
    """What both tensor-descriptor paths take (core_triton.attention.flash_fwd_tma)."""
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
        and D in TMA_CONFIGS
        and Tq >= 1
        and Tk >= 1
        and all(_row_major(t) for t in (q, k, v))
    )


def _tma_forward(q, k, v, opts, sink, out_dtype, plain, n_sink, sink_stride) -> LaunchPlan | None:
    """The forward through flash_fwd_tma_kernel, or None where it does not
    apply (see core_triton.attention.flash_fwd_tma)."""
    if not (TMA_FORWARD and _tma_applies(q, k, v, opts, plain, out_dtype)):
        return None
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    bm, bn, w, s = _TMA_INTERPRETED if interpreter_requested() else TMA_CONFIGS[D]
    return LaunchPlan(
        kernel=flash_fwd_tma_kernel,
        grid=(cdiv(Tq, bm), B * HQ),
        params=(
            In("q"),
            In("k"),
            In("v"),
            In("softmax_aux") if sink is not None else In("q"),
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
            DOT_PREC="tf32",
            BM=bm,
            BN=bn,
        ),
        num_warps=w,
        num_stages=s,
    )


def _tma_grads(q, k, v, do, opts, plain, grad_dtype) -> tuple[LaunchPlan, LaunchPlan] | None:
    """The dK/dV and dQ launches of flash_bwd_tma, or None where they do not
    apply (their inputs: ``q, k, v, do, lse, delta``)."""
    if not (
        TMA_BACKWARD
        and _tma_applies(q, k, v, opts, plain, grad_dtype)
        and do.dtype == q.dtype
        and do.shape == q.shape
        and _row_major(do)
    ):
        return None
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    configs = _TMA_BWD_INTERPRETED if interpreter_requested() else TMA_BWD_CONFIGS[D]
    (bm, bn, w, s), (bm2, bn2, w2, s2) = configs
    params = (In("q"), In("k"), In("v"), In("do"), In("lse"), In("delta"), opts.scale, B, Tq, Tk, HQ, H)
    consts = dict(D=D, CAUSAL=opts.causal, DOT_PREC="tf32")
    dkdv = LaunchPlan(
        kernel=flash_bwd_dkdv_tma_kernel,
        grid=(cdiv(Tk, bn), B * H),
        params=params,
        outputs=(OutputSpec((B, Tk, H, D), q.dtype), OutputSpec((B, Tk, H, D), q.dtype)),
        output_names=("dk", "dv"),
        constexprs=dict(consts, BM=bm, BN=bn),
        num_warps=w,
        num_stages=s,
    )
    dq = LaunchPlan(
        kernel=flash_bwd_dq_tma_kernel,
        grid=(cdiv(Tq, bm2), B * HQ),
        params=params,
        outputs=(OutputSpec((B, Tq, HQ, D), q.dtype),),
        output_names=("dq",),
        constexprs=dict(consts, BM=bm2, BN=bn2),
        num_warps=w2,
        num_stages=s2,
    )
    return dkdv, dq


def _dim_class(bd: int) -> int:
    return 64 if bd <= 64 else 128 if bd <= 128 else 256


# ---- options --------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """Normalised options of one attention call."""

    causal: bool
    window: tuple[int, int] | None
    cap: float | None
    scale: float
    # "offsets" (positions = index + qoff/koff) or "explicit" (arrays).
    positions: str = "offsets"
    q_pieces: int = 1
    k_pieces: int = 1
    q_chunk: int = 0
    k_chunk: int = 0


def _window(value) -> tuple[int, int] | None:
    if value is None:
        return None

    def one(x, what):
        if x is None:
            return _MAX_WINDOW
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"sliding_window{what} must be an int or None, got {type(x).__name__}")
        if x < 0:
            raise ValueError(f"sliding_window{what} must be >= 0, got {int(x)}")
        return min(int(x), _MAX_WINDOW)

    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"sliding_window must be an int or a (left, right) pair, got {value!r}")
        return one(value[0], "[0] (left)"), one(value[1], "[1] (right)")
    w = one(value, "")
    return w, w


def window_pair(value) -> list[int] | None:
    """``sliding_window`` as the bindings pass it to their ops: ``None`` or
    ``[left, right]`` (a side given as ``None`` is unbounded)."""
    w = _window(value)
    return None if w is None else list(w)


def _cap(value) -> float | None:
    cap = checks.check_scale(value, "logits_soft_cap")
    if cap is not None and cap <= 0:
        raise ValueError(f"logits_soft_cap must be positive, got {cap}")
    return cap


def check_sinks(softmax_aux: TensorInfo | None, HQ: int) -> None:
    """Sinks ``[HQ]`` or ``[HQ, S]`` (S >= 1) of a float dtype, or None
    (flash_attention, ring_attention, decode_attention)."""
    if softmax_aux is None:
        return
    checks.check_float_tensor(softmax_aux, "softmax_aux")
    if softmax_aux.ndim not in (1, 2) or softmax_aux.shape[0] != HQ or 0 in softmax_aux.shape:
        raise ValueError(
            f"softmax_aux must be [HQ={HQ}] or [HQ={HQ}, S], got shape {list(softmax_aux.shape)}"
        )


def _check_ids(info: TensorInfo | None, name: str, batch: int, length: int, allow_1d: bool) -> None:
    if info is None:
        return
    if info.dtype not in checks.INDEX_DTYPES:
        raise TypeError(f"{name} must be int32 (or int64), got {info.dtype}")
    shapes = [(batch, length)] + ([(length,)] if allow_1d else [])
    if tuple(info.shape) not in shapes:
        want = " or ".join(str(list(s)) for s in shapes)
        raise ValueError(f"{name} must have shape {want}, got {list(info.shape)}")


def validate(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    q_segment_ids=None,
    kv_segment_ids=None,
    softmax_aux=None,
    bias=None,
    sliding_window=None,
    causal=False,
    logits_soft_cap=None,
    softmax_scale=None,
    q_positions=None,
    kv_positions=None,
    return_lse=False,
    kv_len: int | None = None,
):
    """The argument checks of docs/api.md#flash_attention; returns ``(Options, return_lse)``.
    ``kv_len``: the length of the whole key sequence (the bias's last dim)
    when ``key`` is one shard of it (the ring)."""
    for info, name in ((query, "query"), (key, "key"), (value, "value")):
        checks.check_float_tensor(info, name)
        checks.check_rank(info, name, (4,), "[batch, seq_len, num_heads, head_dim]")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(
            f"query, key and value must share one dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    B, Tq, HQ, D = query.shape
    Bk, Tk, H, Dk = key.shape
    if Bk != B or value.shape[0] != B:
        raise ValueError(f"key and value must have query's batch size {B}, got {Bk} and {value.shape[0]}")
    if value.shape[1] != Tk or value.shape[2] != H:
        raise ValueError(f"value must be [B, Tk={Tk}, H={H}, Dv], got shape {list(value.shape)}")
    if Dk != D:
        raise ValueError(f"key's head_dim must equal query's ({D}), got {Dk}")
    if H < 1 or HQ % H:
        raise ValueError(f"query's heads ({HQ}) must be a multiple of key's heads ({H})")
    if min(Tq, Tk) < 1:
        raise ValueError(f"query and key need seq_len >= 1, got {Tq} and {Tk}")
    for dim, name in ((D, "query/key head_dim"), (value.shape[3], "value head_dim")):
        if not 1 <= dim <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in 1..{MAX_HEAD_DIM}, got {dim}")
    causal = checks.check_bool(causal, "causal")
    return_lse = checks.check_bool(return_lse, "return_lse")
    scale = checks.check_scale(softmax_scale)
    _check_ids(q_segment_ids, "q_segment_ids", B, Tq, False)
    _check_ids(kv_segment_ids, "kv_segment_ids", B, Tk, False)
    if q_segment_ids is not None and kv_segment_ids is None and Tq != Tk and kv_len is None:
        raise ValueError("q_segment_ids alone is used for the keys too, so it needs Tq == Tk")
    if kv_segment_ids is not None and q_segment_ids is None and Tq != Tk and kv_len is None:
        raise ValueError("kv_segment_ids alone is used for the queries too, so it needs Tq == Tk")
    _check_ids(q_positions, "q_positions", B, Tq, True)
    _check_ids(kv_positions, "kv_positions", B, Tk, True)
    check_sinks(softmax_aux, HQ)
    cols = Tk if kv_len is None else kv_len
    if bias is not None:
        checks.check_float_tensor(bias, "bias")
        s = tuple(bias.shape)
        if len(s) != 4 or s[0] not in (1, B) or s[1] not in (1, HQ) or s[2:] != (Tq, cols):
            raise ValueError(
                f"bias must be [B|1, HQ|1, Tq, Tk] = [{B}|1, {HQ}|1, {Tq}, {cols}], got {list(s)}"
            )
    checks.check_same_device(
        {
            "query": query,
            "key": key,
            "value": value,
            "q_segment_ids": q_segment_ids,
            "kv_segment_ids": kv_segment_ids,
            "softmax_aux": softmax_aux,
            "bias": bias,
            "q_positions": q_positions,
            "kv_positions": kv_positions,
        }
    )
    explicit = q_positions is not None or kv_positions is not None
    options = Options(
        causal=causal,
        window=_window(sliding_window),
        cap=_cap(logits_soft_cap),
        scale=D**-0.5 if scale is None else scale,
        positions="explicit" if explicit else "offsets",
        q_chunk=Tq,
        k_chunk=Tk,
    )
    return options, return_lse


# ---- plans ----------------------------------------------------------------


@dataclass(frozen=True)
class AttentionPlans:
    """``forward``: one launch, inputs ``q, k, v, qoff, koff`` and the
    optional ones, outputs ``(out, lse)``.  ``preprocess(o, do)`` -> delta;
    ``grads(do)`` -> ``(dkdv, dq)`` launches taking also ``lse`` and
    ``delta``.  ``dbias(do)``: the bias-gradient launch (same inputs as
    ``grads``; output ``dbias`` in the bias's shape and dtype, its columns
    the *local* keys ``0..Tk-1``), None without a bias; launch it only when
    the bias needs a gradient."""

    forward: LaunchPlan
    preprocess: Callable[[TensorInfo, TensorInfo], LaunchPlan]
    grads: Callable[[TensorInfo], tuple[LaunchPlan, LaunchPlan]]
    dbias: Callable[[TensorInfo], LaunchPlan | None]
    qoff: tuple[int, ...]
    koff: tuple[int, ...]


def _div16(ints) -> int:
    return sum(1 << k for k, v in enumerate(ints) if v > 1 and v % 16 == 0)


def _bh(info: TensorInfo) -> tuple[int, int]:
    """Batch and head strides of a ``[B, T, H, D]`` tensor."""
    return info.strides[0], info.strides[2]


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
    dim_class = _dim_class(max(BD, BDV))
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
    fixed = 0 if interpreter_requested() else _FIXED[dim_class]

    def config(kind, table):
        """(BM, BN, num_warps, num_stages) of ``kind``, or None to autotune."""
        if dim_class == 256 and q.dtype == "float32" and not interpreter_requested():
            return _FLOAT32_256  # every kernel and feature
        if tuned:
            chosen = _measured_choice(kind, dim_class, opts.causal, Tq, Tk)
            # Float32 never autotunes: its products run on FMA units (IEEE),
            # where the sweep's large tiles only spill, and compiling every
            # candidate made a first float32 call at head dim 64 take minutes
            # (jax-triton compiles them all too).  It takes the features' config.
            if chosen is not None or q.dtype != "float32":
                return chosen
        return table[dim_class][min(fixed, len(table[dim_class]) - 1)]

    def kernel_and_grid(kind, table, rows, programs):
        chosen = config(kind[0], table)
        if chosen is None:
            grid = lambda meta: (cdiv(rows, meta[kind[1]]), programs)  # noqa: E731
            return _tuned(kind[0], dim_class), grid, {}, None, None
        bm, bn, w, s = chosen
        block = {"BM": bm, "BN": bn}
        kernel = {"fwd": flash_fwd_kernel, "dkdv": flash_bwd_dkdv_kernel, "dq": flash_bwd_dq_kernel}[kind[0]]
        return kernel, (cdiv(rows, block[kind[1]]), programs), block, w, s

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
        opts.scale,
        1.0 if opts.cap is None else opts.cap,
        left,
        right,
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

    kernel, grid, block, w, s = kernel_and_grid(("fwd", "BM"), _FWD_CONFIGS, Tq, B * HQ)
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
            *q.strides,
            *k.strides,
            *v.strides,
            *aux_strides,
            n_sink,
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
            DIV16=_div16((q.strides[1], k.strides[1], v.strides[1], *_bh(q), *_bh(k), *_bh(v))),
            **block,
        ),
        num_warps=w,
        num_stages=s,
    )
    # The ring's blocks (position offsets other than 0) keep the main kernel.
    plain = tuned and not has_seg and tuple(qoff) == (0,) and tuple(koff) == (0,)
    forward = _tma_forward(q, k, v, opts, sink, out_dtype, plain, n_sink, n_sink) or forward

    # Cached: the torch binding replays a plan's compiled launch only when
    # the same plan object comes back (core_triton.common.launch).
    @functools.lru_cache(maxsize=8)
    def preprocess(o: TensorInfo, do: TensorInfo) -> LaunchPlan:
        bm = 32 if interpreter_requested() else 64
        return LaunchPlan(
            kernel=flash_bwd_preprocess_kernel,
            grid=(cdiv(Tq, bm), B * HQ),
            params=(In("o"), In("do"), Tq, HQ, *o.strides, *do.strides),
            outputs=(OutputSpec((B, HQ, Tq), "float32"),),
            output_names=("delta",),
            constexprs=dict(DV=DV, BDV=BDV, BM=bm),
            num_warps=4,
            num_stages=1,
        )

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

    @functools.lru_cache(maxsize=8)
    def grads(do: TensorInfo) -> tuple[LaunchPlan, LaunchPlan]:
        tma = _tma_grads(q, k, v, do, opts, plain, grad_dtype)
        if tma is not None:
            return tma
        gdt = grad_dtype or q.dtype
        strides = (*q.strides, *k.strides, *v.strides, *do.strides, *aux_strides)
        rows = (q.strides[1], k.strides[1], v.strides[1], do.strides[1])
        consts = dict(common, DIV16=_div16((*rows, *_bh(q), *_bh(k), *_bh(v), *_bh(do))))
        kernel, grid, block, w, s = kernel_and_grid(("dkdv", "BN"), _DKDV_CONFIGS, Tk, B * H)
        dkdv = LaunchPlan(
            kernel=kernel,
            grid=grid,
            params=(*grad_params, H, *strides),
            outputs=(OutputSpec((B, Tk, H, D), gdt), OutputSpec((B, Tk, H, DV), gdt)),
            output_names=("dk", "dv"),
            constexprs=dict(consts, **block),
            num_warps=w,
            num_stages=s,
        )
        kernel, grid, block, w, s = kernel_and_grid(("dq", "BM"), _DQ_CONFIGS, Tq, B * HQ)
        dq = LaunchPlan(
            kernel=kernel,
            grid=grid,
            params=(*grad_params, HQ, *strides),
            outputs=(OutputSpec((B, Tq, HQ, D), gdt),),
            output_names=("dq",),
            constexprs=dict(consts, **block),
            num_warps=w,
            num_stages=s,
        )
        return dkdv, dq

    @functools.lru_cache(maxsize=8)
    def dbias(do: TensorInfo) -> LaunchPlan | None:
        if bias is None:
            return None
        Bb, Hb = bias.shape[0], bias.shape[1]
        strides = (*q.strides, *k.strides, *v.strides, *do.strides, *aux_strides)
        # The same working set as the dQ kernel (BM queries, BN keys, q/dO
        # and k/v tiles): its config (a bias is never autotuned).
        bm, bn, w, s = config("dq", _DQ_CONFIGS)
        consts = {n: common[n] for n in _DBIAS_CONSTS}
        return LaunchPlan(
            kernel=flash_bwd_dbias_kernel,
            grid=(cdiv(Tq, bm), cdiv(Tk, bn), Bb * Hb),
            params=(*grad_params, HQ, B // Bb, HQ // Hb, *strides),
            outputs=(OutputSpec((Bb, Hb, Tq, Tk), bias.dtype),),
            output_names=("dbias",),
            constexprs=dict(consts, BM=bm, BN=bn),
            num_warps=w,
            num_stages=s,
        )

    return AttentionPlans(forward, preprocess, grads, dbias, tuple(qoff), tuple(koff))


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


def missing_positions(query_len: int, key_len: int, q_positions, kv_positions) -> dict[str, int]:
    """``{name: length}`` of the position arrays a binding must make as
    ``arange(length)`` (int32): the missing one when the other is given."""
    if q_positions is None and kv_positions is None:
        return {}
    out = {}
    if q_positions is None:
        out["q_positions"] = query_len
    if kv_positions is None:
        out["kv_positions"] = key_len
    return out
