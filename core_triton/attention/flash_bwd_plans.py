"""``flash_attention``'s gradient launches (flash.py's ``AttentionPlans``
``grads`` and ``dbias``), planned from what the forward's plan worked out
(:class:`GradShared`).

* ``grads(do, o, dlse)``: ``flash_bwd_dkdv_kernel`` -> ``(dk, dv)`` (a
  program per key block, or per key block and share of the query-head
  group, then ``flash_bwd_split_sum_kernel`` adding the shares' float32
  partials) and ``flash_bwd_dq_kernel`` -> ``(dq, delta)`` (per query
  block; ``delta [B, HQ, Tq]`` float32, the rows' ``sum(o * do)`` less the
  ``lse`` cotangent, read by the dK/dV and bias-gradient launches, so the
  dQ launches run first), each a tuple of launches (a gated pair with
  segment ranges, flash.gated_pair);
* on sm_90 GPUs, for plain and causal half-precision attention at head
  dim 128, ``grads`` takes the Gluon kernels instead where they apply
  (flash_bwd_dq_gluon -> ``(dq, delta)``, flash_bwd_dkdv_gluon -> ``(dk,
  dv)``, one launch each; flash_tma_plans.gluon_backward);
* ``dbias(do)``: ``flash_bwd_dbias_kernel`` -> ``dbias`` in the bias's
  shape and dtype, None without a bias.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from core_triton.attention.flash_bwd import flash_bwd_dbias_kernel, flash_bwd_split_sum_kernel
from core_triton.attention.flash_common import DBIAS_GROUPS
from core_triton.attention.flash_configs import (
    DKDV_CONFIGS,
    DQ_CONFIGS,
    dkdv_splits,
    stride_hint_bits,
    unpack,
)
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import multiprocessor_count
from core_triton.common.utils import cdiv

# Elements a program of the split sum adds (flash_bwd_split_sum_kernel).
_SUM_BLOCK = 1024

# Constexprs of the bias-gradient kernel (it always reads a bias): its groups'.
_DBIAS_CONSTS = tuple(n for names in DBIAS_GROUPS.values() for n in names)


@dataclass(frozen=True, eq=False)
class GradShared:
    """What the gradient launches take from the forward's plan: the inputs'
    layouts, the constexprs every kernel shares (``common``),
    the inputs and scalars of every gradient launch in kernel order
    (``grad_params``), the optional inputs' strides (``aux_strides``), the
    gradients' dtype (None: the inputs'), and the tile choice
    (``config(kind, table, ranged, splits)`` -> ``(BM, BN, num_warps,
    num_stages[, maxnreg])`` or None to autotune; ``kernel_and_grid(kind,
    table, rows, programs, ranged, splits)`` -> ``(kernel, grid, consts,
    num_warps, num_stages, maxnreg)``, ``consts`` the tile and the launch
    order ``ORDER``), ``gate``: None, or the function that
    splits a ranged launch into its gated pair (flash.gated_pair), and
    ``hopper``: None, or the function of ``(do, o, dlse, splits)`` (the
    Triton dK/dV's split) that returns the Gluon backward's ``(dkdv, dq)``
    launches, each None where it does not apply
    (flash_tma_plans.gluon_backward)."""

    q: TensorInfo
    k: TensorInfo
    v: TensorInfo
    bias: TensorInfo | None
    common: dict
    grad_params: tuple
    aux_strides: tuple
    grad_dtype: str | None
    config: Callable
    kernel_and_grid: Callable
    gate: Callable | None = None
    hopper: Callable | None = None


def _stride_args(q, k, v, do, aux_strides) -> tuple[tuple[int, ...], ...]:
    """The backward kernels' stride arguments: q's, k's, v's and dO's
    strides and the optional inputs' (``aux_strides``), each one tuple."""
    return tuple(tuple(x) for x in (q.strides, k.strides, v.strides, do.strides, aux_strides))


def backward_plans(shared: GradShared):
    """``(grads, dbias)``: functions of the cotangent's (and output's)
    layouts that return the launches (cached per layout)."""
    q, k, v, bias = shared.q, shared.k, shared.v, shared.bias
    common, grad_params, aux_strides = shared.common, shared.grad_params, shared.aux_strides
    grad_dtype, config, kernel_and_grid = shared.grad_dtype, shared.config, shared.kernel_and_grid
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    DV = v.shape[3]

    # Cached: the torch binding replays a plan's compiled launch only when
    # the same plan object comes back (core_triton.common.launch).
    @functools.lru_cache(maxsize=8)
    def grads(
        do: TensorInfo, o: TensorInfo, dlse: bool = False
    ) -> tuple[tuple[LaunchPlan, ...], tuple[LaunchPlan, ...]]:
        """``(dkdv_steps, dq_steps)`` for a cotangent ``do`` and an output
        ``o`` of these layouts; ``dlse``: whether the dQ launch subtracts
        an ``lse`` cotangent (input ``dlse``, ``[B, HQ, Tq]`` float32,
        contiguous)."""
        gdt = grad_dtype or q.dtype
        strides = _stride_args(q, k, v, do, aux_strides)
        consts = dict(common, DIV16=stride_hint_bits(q, k, v, do))
        splits = dkdv_split()
        hopper_dkdv, hopper_dq = shared.hopper(do, o, dlse, splits) if shared.hopper else (None, None)
        if shared.gate is not None:  # the Gluon launches, if any, first of the gated pairs
            dkdv_steps = dkdv_launches(gdt, strides, consts, splits, hopper_dkdv)
            dq_steps = dq_launches(gdt, strides, consts, do, o, dlse, hopper_dq)
        else:
            dkdv_steps = (hopper_dkdv,) if hopper_dkdv else dkdv_launches(gdt, strides, consts, splits)
            dq_steps = (hopper_dq,) if hopper_dq else dq_launches(gdt, strides, consts, do, o, dlse)
        return dkdv_steps, dq_steps

    def dkdv_split():
        """How many programs flash_bwd_dkdv_kernel splits a key block's
        query-head group over (flash_configs.dkdv_splits)."""
        chosen = config("dkdv", DKDV_CONFIGS, splits=None)
        # The split is fixed before an autotuned tile is known (and head dim
        # 64's measured tiles depend on it): 64 keys a block.
        bn = 64 if chosen is None else chosen[1]
        return dkdv_splits(cdiv(Tk, bn), B * H, HQ // H, multiprocessor_count(), Tq)

    def dkdv_launches(gdt, strides, consts, splits, first=None):
        """flash_bwd_dkdv_kernel's launches (and the split's sum); ``first``:
        a gated pair's first launch, if not the Triton kernel's own."""
        dkdv_tiles = functools.partial(kernel_and_grid, ("dkdv", "BN"), DKDV_CONFIGS, Tk, B * H * splits)
        kernel, grid, block, w, s, cap = dkdv_tiles(splits=splits)
        grads_out = tuple(OutputSpec((B, Tk, H, d), gdt) for d in (D, DV))  # dK, dV
        if splits == 1:
            outputs, names = grads_out, ("dk", "dv")
        else:
            outputs = tuple(OutputSpec((splits, B, Tk, H, d), "float32") for d in (D, DV))
            names = ("dk_part", "dv_part")
        dkdv = LaunchPlan(
            kernel=kernel,
            grid=grid,
            params=(*grad_params, H, splits, *strides, In("q"), In("q")),  # DK_IN, DV_IN: flash.gated_pair
            outputs=outputs,
            output_names=names,
            # Whether it splits (a plan choice of three values, as ROW64 is
            # of two): 0 no, 2 one query head a program, 1 a share of them.
            constexprs=dict(consts, SPLIT=0 if splits == 1 else 2 if splits == HQ // H else 1, **block),
            num_warps=w,
            num_stages=s,
            maxnreg=cap,
        )
        # A gated pair's first launch takes plain attention's tiles.
        dkdv_steps = (dkdv,) if shared.gate is None else shared.gate(dkdv, first, dkdv_tiles(False, splits))
        if splits > 1:
            n_k, n_v = B * Tk * H * D, B * Tk * H * DV
            dkdv_steps += (
                LaunchPlan(
                    kernel=flash_bwd_split_sum_kernel,
                    grid=(cdiv(max(n_k, n_v), _SUM_BLOCK), 2),
                    params=(In("dk_part"), In("dv_part"), n_k, n_v, splits),
                    outputs=grads_out,
                    output_names=("dk", "dv"),
                    constexprs=dict(BLOCK=_SUM_BLOCK),
                    num_warps=4,
                    num_stages=1,
                ),
            )
        return dkdv_steps

    def dq_launches(gdt, strides, consts, do, o, dlse, first=None):
        """flash_bwd_dq_kernel's launches; ``first``: a gated pair's first
        launch, if not the Triton kernel's own."""
        dq_tiles = functools.partial(kernel_and_grid, ("dq", "BM"), DQ_CONFIGS, Tq, B * HQ)
        kernel, grid, block, w, s, cap = dq_tiles()
        # The dQ kernel reads the output where the others read delta (it
        # makes delta: flash_bwd.flash_bwd_dq_kernel).
        dq_params = tuple(In("o") if p == In("delta") else p for p in grad_params)
        dq = LaunchPlan(
            kernel=kernel,
            grid=grid,
            params=(
                *dq_params,
                HQ,
                In("dlse") if dlse else In("q"),
                *strides,
                tuple(o.strides),
                # DQ_IN, DELTA_IN: flash.gated_pair
                In("q"),
                In("q"),
            ),
            outputs=(OutputSpec((B, Tq, HQ, D), gdt), OutputSpec((B, HQ, Tq), "float32")),
            output_names=("dq", "delta"),
            constexprs=dict(consts, DIV16=stride_hint_bits(q, k, v, do, o), HAS_DLSE=dlse, **block),
            num_warps=w,
            num_stages=s,
            maxnreg=cap,
        )
        return (dq,) if shared.gate is None else shared.gate(dq, first, dq_tiles(False))

    @functools.lru_cache(maxsize=8)
    def dbias(do: TensorInfo) -> LaunchPlan | None:
        if bias is None:
            return None
        Bb, Hb = bias.shape[0], bias.shape[1]
        strides = _stride_args(q, k, v, do, aux_strides)
        # The same working set as the dQ kernel (BM queries, BN keys, q/dO
        # and k/v tiles): its config (a bias is never autotuned).
        bm, bn, w, s, _ = unpack(config("dq", DQ_CONFIGS))
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

    return grads, dbias
