"""Launch planning shared by ``chunk_local_cumsum`` and ``chunk_global_cumsum``."""

from __future__ import annotations

import functools

from core_triton.common import checks
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.op import OpPlans
from core_triton.common.runtime import is_interpreted
from core_triton.common.sequences import zero_uncovered_plan
from core_triton.common.utils import cdiv, contiguous_strides, next_power_of_2
from core_triton.cumsum.segment_cumsum import segment_cumsum_kernel

# Tiles hold about this many float32 values: enough per load to keep a
# Hopper SM busy, few enough to stay in registers.
_TILE_ELEMENTS = 4096
# A whole-sequence scan runs as two launches over chunks of this many tokens
# (chunk totals, then scans that start from them), whatever the lengths and
# the number of sequences: a block size that followed either would compile
# a new kernel whenever packed training changes them.  Under the
# interpreter, shorter chunks make the tests' short sequences span several.
_GLOBAL_CHUNK = 256
_GLOBAL_CHUNK_INTERPRETED = 64
# Packed input: feature tiles per program (plan's ``ft``) and warps per
# program.  H100, chunk_local_cumsum of [1, 32768, 32, 128] float32 in 16
# documents, chunks of 64, CUDA-graph replay, us (the same tokens batched:
# 381.0 at 4 warps; fla's packed kernel 381.9):
#
#   warps       2      4      8
#   1 tile    388.5  496.4  452.9
#   8 tiles   402.5  446.3  438.4
#
# (with a binary search for the window's sequence, before chunk_offsets
# carried each slot's: 508.5 at 1 tile and 4 warps, 447.0 at 8).  A packed
# program waits on two dependent loads (its slot's sequence, then that
# sequence's bounds) before its tile's; two warps a program fit twice the
# programs on an SM, which most likely hides that wait (not profiled).
PACKED_FEATURE_TILES = 1
PACKED_NUM_WARPS = 2

# Warps per program of batched input, and the tile's feature width at most
# (plan's ``bf``; 32 or 128 were no faster for packed input above).
NUM_WARPS = 4
MAX_FEATURE_TILE = 64


# Plans depend on shapes and options only: cache them, so an eager call
# (PyTorch, or JAX outside jit) does not rebuild them every time.
@functools.lru_cache(maxsize=1024)
def make_plans(
    x, cu_seqlens, *, chunk, reverse, scale, head_first, out_dtype, zero_uncovered=False
) -> OpPlans:
    """``chunk=None``: one window per sequence (the global scan).
    ``zero_uncovered`` (the public ops): packed input's output is allocated
    unfilled and the rows no window covers are zeroed after the scan (its
    last launch is then that one, writing ``out`` in place); else the output
    is zero-filled first (the ops that take the scan as a step and rename
    its output)."""
    split = chunk is None
    if split:
        chunk = _GLOBAL_CHUNK_INTERPRETED if is_interpreted(segment_cumsum_kernel) else _GLOBAL_CHUNK
    options = dict(
        chunk=chunk, split=split, scale=scale, head_first=head_first, zero_uncovered=zero_uncovered
    )
    forward = plan(x, cu_seqlens, reverse=reverse, out_dtype=out_dtype, **options)
    # d/dx of a windowed running sum is the opposite-direction running sum
    # over the same windows, scaled alike, in the input's dtype.
    backward = functools.partial(
        plan, cu_seqlens=cu_seqlens, reverse=not reverse, out_dtype=x.dtype, **options
    )
    # The backward reads the cotangent as its input ``x``; both read the
    # strides they are given (no copy).
    return OpPlans(
        forward=forward,
        backward=backward,
        inputs=("x",),
        outputs=("out",),
        cotangents=("x",),
        grads=(("x", "out"),),
        offsets=(("chunk_offsets", chunk),) if cu_seqlens is not None else (),
        seq_len=_layout(x, head_first)[0][1],
        contiguous=False,
    )


def _local_tile(chunk: int, F: int) -> tuple[int, int]:
    """(BT, BF) of a chunk-window program: feature rows up to 64 wide (256
    bytes of float32, whole cache lines), time filling the rest of the tile."""
    bf = min(next_power_of_2(F), MAX_FEATURE_TILE)
    return min(chunk, max(16, _TILE_ELEMENTS // bf)), bf


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


def _length_free_strides(shape, strides, t_axis: int) -> tuple[int, ...]:
    """``strides`` with every stride that grows with the sequence length
    replaced by its value at length 1, when the layout is row-major (then
    the true stride is that value times the length, so a multiple of 16
    stays one whatever the length).  The divisibility hints, compile-time
    constants, then do not change from one length to the next.  Other
    layouts keep their own strides."""
    if tuple(strides) != contiguous_strides(shape):
        return tuple(strides)
    one = list(shape)
    one[t_axis] = 1
    return tuple(
        s if i >= t_axis else c for i, (s, c) in enumerate(zip(strides, contiguous_strides(one), strict=True))
    )


def validate(
    x: TensorInfo,
    cu_seqlens: TensorInfo | None,
    reverse,
    softmax_scale,
    head_first,
    output_dtype,
    name: str,
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
    zero_uncovered: bool = False,
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
    bt, bf = _local_tile(chunk, F)
    # Packed input: a program takes up to PACKED_FEATURE_TILES feature tiles
    # of its window (the kernel's FT), so that its window lookup is paid
    # once for them; batched input has no lookup.
    ft = max(1, min(PACKED_FEATURE_TILES, cdiv(F, bf))) if varlen else 1
    slots = cdiv(T, chunk) + (n_seq if varlen else 0)
    grid = (slots, 1 if varlen else B, cdiv(F, bf * ft))
    if B * T * F == 0:
        grid = (0, 0, 0)
    # What is known of each stride whatever the length (see the function).
    t_axis = 2 if head_first else 1
    free_x = _length_free_strides(x.shape, x.strides, t_axis)
    free_o = _length_free_strides(x.shape, contiguous_strides(x.shape), t_axis)
    if x.ndim == 3:
        free_x, free_o = (*free_x, 1), (*free_o, 1)
    order = (0, 2, 1, 3) if head_first else (0, 1, 2, 3)  # to (b, t, h, s)
    free = [free_x[i] for i in order] + [free_o[i] for i in order]
    actual = (sb, st, sh, ss, ob, ot, oh, os_)
    # A stride that grows with the length (batch; heads of a head-first
    # layout) is 1 only at length 1: no unit fact for it.
    grows = (True, False, head_first, False) * 2
    unit = sum(
        1 << k for k, (f, a, g) in enumerate(zip(free, actual, grows, strict=True)) if f == a == 1 and not g
    )

    def launch(pass_, inputs_totals, output):
        return LaunchPlan(
            kernel=segment_cumsum_kernel,
            grid=grid,
            params=(
                In("x"),
                In("cu_seqlens") if varlen else In("x"),
                In("chunk_offsets") if varlen else In("x"),
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
                CHUNK=chunk,
                BT=bt,
                BF=bf,
                REVERSE=reverse,
                IS_VARLEN=varlen,
                HAS_SCALE=scale is not None,
                DIV16=_divisible_by_16_mask((*free, F)),
                UNIT=unit,
                PASS=pass_,
                BJ=16,
                FT=ft,
            ),
            num_warps=PACKED_NUM_WARPS if varlen else NUM_WARPS,
            num_stages=2,
        )

    # Packed input: tokens that no window covers (traced cu_seqlens that
    # break the contract) are written by no program; they get 0 from a zero
    # fill first or, with zero_uncovered, from a launch after the scan that
    # writes only them (H100, chunk_local_cumsum of [1, 32768, 32, 128]
    # float32 in 16 documents, one feature tile a program: 672.8 us with the
    # fill, 508.5 with the launch).
    zero_after = varlen and zero_uncovered
    result = OutputSpec(tuple(x.shape), out_dtype, 0.0 if varlen and not zero_after else None)
    if not split:
        steps = (launch(0, False, result),)
    else:
        totals = OutputSpec((grid[0], grid[1], F), "float32")
        steps = (launch(1, False, totals), launch(2, True, result))
    if zero_after:
        steps += (zero_uncovered_plan("out", tuple(x.shape), out_dtype, t_axis, n_seq, chunk, slots),)
    return steps
