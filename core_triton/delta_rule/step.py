"""``gated_delta_rule_step``: decoding, a few new tokens per sequence
against a carried float32 state, updated in its own buffer.

The recurrent forward kernel (recurrent_fwd.py) with the state as both its
initial state and its final-state output (each program reads its tile
before it writes it), which L2-normalises q and k itself where asked.  Forward
only.  Inputs by name: ``query``, ``key``, ``value``, ``beta``, ``g`` or
``gk``, ``state``; outputs ``o`` and ``state`` (the same buffer).
"""

from __future__ import annotations

import dataclasses
import functools

from core_triton.common.launch import LaunchPlan, TensorInfo
from core_triton.common.utils import contiguous_strides
from core_triton.delta_rule import recurrent
from core_triton.delta_rule.args import validate


def plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    beta: TensorInfo,
    state: TensorInfo,
    g: TensorInfo | None = None,
    gk: TensorInfo | None = None,
    softmax_scale=None,
    use_qk_l2norm=False,
) -> tuple[LaunchPlan, ...]:
    """Check the arguments and plan the launches (the last writes ``o`` and
    the state)."""
    if state is None:
        raise TypeError("state is required")
    a, _ = validate(
        query, key, value, beta, g, gk, softmax_scale, state, True, None, use_qk_l2norm, "recurrent"
    )
    if state.dtype != "float32":
        raise TypeError(f"state must be float32 (it is updated in place), got {state.dtype}")
    if tuple(state.strides) != contiguous_strides(state.shape):
        raise ValueError(
            f"state must be contiguous (it is updated in place), got strides {tuple(state.strides)}"
        )
    dtypes = {"beta": beta.dtype, "initial_state": "float32"}
    for name, t in (("g", g), ("gk", gk)):
        if t is not None:
            dtypes[name] = t.dtype
    return _make(a, tuple(sorted(dtypes.items())))


def _warps(bk: int, bv: int) -> int:
    """A warp per 2048 state values: a decoding program makes one pass over
    its tile, and more programs in flight per SM beat more warps per
    program (H100, HV 32, K = V = 128, value tiles of 16, CUDA-graph
    replay: B64 102.5 us at one warp against 106.3 at two, B16 18.6
    against 21.3; bench/probes/delta_step_sweep.py)."""
    return max(1, bk * bv // 2048)


@functools.lru_cache(maxsize=256)
def _make(a, dtypes) -> tuple[LaunchPlan, ...]:
    forward, *_ = recurrent.make_plans(a, dict(dtypes))
    *pre, step = forward
    params = tuple(
        dataclasses.replace(p, name="state") if getattr(p, "name", None) == "initial_state" else p
        for p in step.params
    )
    bk, bv = step.constexprs["BK"], step.constexprs["BV"]
    step = dataclasses.replace(
        step, params=params, output_names=("o", "state"), aliases=((1, "state"),), num_warps=_warps(bk, bv)
    )
    return (*pre, step)
