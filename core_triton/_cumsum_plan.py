"""Launch planning shared by ``chunk_local_cumsum`` and ``chunk_global_cumsum``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from core_triton import checks
from core_triton.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.segment_cumsum import segment_cumsum_kernel
from core_triton.utils import cdiv, contiguous_strides, next_power_of_2

# Tiles hold about this many float32 values: enough per load to keep a
# Hopper SM busy, few enough to stay in registers.
_TILE_ELEMENTS = 4096
# A one-launch global scan is sequential along time, so it gets one program
# per (sequence, feature tile); with fewer than this many (a couple per SM),
# and sequences long enough to split, it runs as two launches over chunks.
_MIN_GLOBAL_PROGRAMS = 512
_SPLIT_MIN_SEQ_LEN = 1024
# The split scan sizes its chunks for about this many programs.
_SPLIT_TARGET_PROGRAMS = 1024
_SPLIT_MAX_CHUNK = 8192


@dataclass(frozen=True)
class CumsumPlans:
    """Forward launches, the backward launches as a function of the
    cotangent's TensorInfo, and the chunk size for ``chunk_offsets``
    (``None``: the kernels take no ``chunk_offsets``)."""

    forward: tuple[LaunchPlan, ...]
    backward: Callable[[TensorInfo], tuple[LaunchPlan, ...]]
    offsets_chunk_size: int | None


# Plans depend on shapes and options only: cache them, so an eager call
# (PyTorch, or JAX outside jit) does not rebuild them every time.
@functools.lru_cache(maxsize=1024)
def make_plans(x, cu_seqlens, *, chunk, reverse, scale, head_first, out_dtype) -> CumsumPlans:
    if chunk is None:
        chunk = _split_chunk(x, cu_seqlens, head_first)
        split = chunk is not None
    else:
        split = False
    options = dict(chunk=chunk, split=split, scale=scale, head_first=head_first)
    forward = plan(x, cu_seqlens, reverse=reverse, out_dtype=out_dtype, **options)
    # d/dx of a windowed running sum is the opposite-direction running sum
    # over the same windows, scaled alike, in the input's dtype.  The
    # cotangent has x's shape, so the backward makes the same split choice.
    backward = functools.partial(
        plan, cu_seqlens=cu_seqlens, reverse=not reverse, out_dtype=x.dtype, **options
    )
    offsets = chunk if (cu_seqlens is not None and chunk is not None) else None
    return CumsumPlans(forward, backward, offsets)


def _local_tile(chunk: int, F: int) -> tuple[int, int]:
    """(BT, BF) of a chunk-window program: feature rows up to 64 wide (256
    bytes of float32, whole cache lines), time filling the rest of the tile."""
    bf = min(next_power_of_2(F), 64)
    return min(chunk, max(16, _TILE_ELEMENTS // bf)), bf


def _global_tile(T: int, F: int, rows: int) -> tuple[int, int]:
    """(BT, BF) of a one-launch global scan: feature tiles as wide as 128
    but split down to 16 while there are too few programs."""
    bt = min(64, next_power_of_2(max(T, 1)))
    bf = min(128, next_power_of_2(F))
    while bf > 16 and rows * cdiv(F, bf) < _MIN_GLOBAL_PROGRAMS:
        bf //= 2
    return bt, bf


def _split_chunk(x: TensorInfo, cu_seqlens: TensorInfo | None, head_first: bool) -> int | None:
    """Chunk length for a two-launch global scan, or None for one launch."""
    (B, T, H, S), _ = _layout(x, head_first)
    F = H * S
    rows = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
    _, bf = _global_tile(T, F, rows)
    if rows * cdiv(F, bf) >= _MIN_GLOBAL_PROGRAMS or T < _SPLIT_MIN_SEQ_LEN:
        return None
    batch_rows = 1 if cu_seqlens is not None else B
    per_chunk_programs = batch_rows * cdiv(F, _local_tile(_SPLIT_MAX_CHUNK, F)[1])
    chunk = next_power_of_2(cdiv(T * per_chunk_programs, _SPLIT_TARGET_PROGRAMS))
    return min(max(chunk, 64), _SPLIT_MAX_CHUNK)


def _layout(x: TensorInfo, head_first: bool):
    """(B, T, H, S) and the (b, t, h, s) element strides of ``x``."""
    if x.ndim == 3:
        shape = (*x.shape, 1)
        strides = (*x.strides, 1)
    else:
        shape, strides = x.shape, x.strides
    if head_first:
        b, h, t, s = shape
        sb, sh, st, ss = strides
    else:
        b, t, h, s = shape
        sb, st, sh, ss = strides
    return (b, t, h, s), (sb, st, sh, ss)


def _divisible_by_16_mask(ints) -> int:
    """Bit k set when ints[k] is a multiple of 16 (and not 0 or 1)."""
    return sum(1 << k for k, v in enumerate(ints) if v > 1 and v % 16 == 0)


def validate(
    x: TensorInfo,
    cu_seqlens: TensorInfo | None,
    reverse,
    softmax_scale,
    head_first,
    output_dtype,
    name: str,
    cu_seqlens_values=None,
):
    """Checks common to both cumsums; returns normalised options."""
    checks.check_float_tensor(x, name)
    checks.check_rank(
        x,
        name,
        (3, 4),
        "[B, T, H] or [B, T, H, S] ([B, H, T] or [B, H, T, S] with head_first=True)",
    )
    reverse = checks.check_bool(reverse, "reverse")
    head_first = checks.check_bool(head_first, "head_first")
    scale = checks.check_scale(softmax_scale)
    out_dtype = x.dtype if output_dtype is None else checks.float_dtype_name(output_dtype, "output_dtype")
    (b, t, _, _), _ = _layout(x, head_first)
    n_seq = checks.check_cu_seqlens(cu_seqlens, b)
    if n_seq == 0 and t != 0:
        raise ValueError(f"cu_seqlens holds no sequence but {name} has seq_len {t}")
    if cu_seqlens is not None and cu_seqlens_values is not None:
        checks.check_cu_seqlens_values(cu_seqlens_values, t)
    checks.check_same_device({name: x, "cu_seqlens": cu_seqlens})
    return reverse, scale, head_first, out_dtype


def plan(
    x: TensorInfo,
    cu_seqlens: TensorInfo | None,
    *,
    chunk: int | None,
    split: bool,
    reverse: bool,
    scale: float | None,
    head_first: bool,
    out_dtype: str,
) -> tuple[LaunchPlan, ...]:
    """Plan a segment cumsum: windows of ``chunk`` tokens, or whole
    sequences when ``chunk`` is None; ``split`` makes a whole-sequence scan
    out of two chunked launches (chunk totals, then scans that start from
    them).  Inputs: ``x``, and with packed input ``cu_seqlens`` and, for
    chunked windows, ``chunk_offsets = prepare_chunk_offsets(cu_seqlens,
    chunk)``.  Output (last launch): ``x``'s shape, contiguous, ``out_dtype``."""
    (B, T, H, S), (sb, st, sh, ss) = _layout(x, head_first)
    F = H * S
    out_strides = contiguous_strides(x.shape)
    if x.ndim == 3:
        out_strides = (*out_strides, 1)
    if head_first:
        ob, oh, ot, os_ = out_strides
    else:
        ob, ot, oh, os_ = out_strides
    varlen = cu_seqlens is not None
    n_seq = cu_seqlens.shape[0] - 1 if varlen else B
    is_global = chunk is None

    if is_global:
        bt, bf = _global_tile(T, F, n_seq)
        # Axis 0 enumerates sequences of packed input; batch rows go on axis 1.
        grid = (n_seq, 1, cdiv(F, bf)) if varlen else (1, B, cdiv(F, bf))
    else:
        bt, bf = _local_tile(chunk, F)
        slots = cdiv(T, chunk) + (n_seq if varlen else 0)
        grid = (slots, 1 if varlen else B, cdiv(F, bf))
    if B * T * F == 0:
        grid = (0, 0, 0)

    def launch(pass_, inputs_totals, output):
        return LaunchPlan(
            kernel=segment_cumsum_kernel,
            grid=grid,
            params=(
                In("x"),
                In("cu_seqlens") if varlen else In("x"),
                In("chunk_offsets") if (varlen and not is_global) else In("x"),
                In("totals") if inputs_totals else In("x"),
                T,
                F,
                n_seq,
                max(n_seq, 1).bit_length() + 1,
                sb,
                st,
                sh,
                ss,
                ob,
                ot,
                oh,
                os_,
                1.0 if scale is None else scale,
            ),
            outputs=(output,),
            output_names=("totals",) if pass_ == 1 else ("out",),
            constexprs=dict(
                S=S,
                CHUNK=1 if is_global else chunk,
                BT=bt,
                BF=bf,
                GLOBAL=is_global,
                REVERSE=reverse,
                IS_VARLEN=varlen,
                HAS_SCALE=scale is not None,
                DIV16=_divisible_by_16_mask((sb, st, sh, ob, ot, oh, T, F)),
                PASS=pass_,
            ),
            num_warps=4,
            num_stages=3 if is_global else 2,
        )

    result = OutputSpec(tuple(x.shape), out_dtype)
    if not split:
        return (launch(0, False, result),)
    totals = OutputSpec((grid[0], grid[1], F), "float32")
    return (launch(1, False, totals), launch(2, True, result))
