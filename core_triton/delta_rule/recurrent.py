"""``gated_delta_rule(mode="recurrent")``: the launches, token by token.

Forward: one launch (recurrent_fwd.py), which L2-normalises query and key
itself where asked (``L2_IN_KERNEL``; else l2norm.py's launches first).
Backward: (the normalisation again), one launch (recurrent_bwd.py) with
checkpoints, then fixed-order sums of its partials
(common/reductions.py), then (the normalisation's backward).

Inputs by name: ``query``, ``key``, ``value``, ``beta``, ``g`` or ``gk``,
``initial_state`` (those given, contiguous), ``cu_seqlens`` and, for the
backward of packed input, ``ckpt_offsets`` (chunk offsets of ``CB``-token
blocks); the backward also reads ``do`` and ``dht``.
"""

from __future__ import annotations

from core_triton.common import reductions
from core_triton.common.launch import In, LaunchPlan, OutputSpec
from core_triton.common.runtime import is_interpreted
from core_triton.common.utils import cdiv, next_power_of_2
from core_triton.delta_rule import steps
from core_triton.delta_rule.args import NO_GATE, SCALAR_GATE, DeltaRuleArgs
from core_triton.delta_rule.naive import L2NORM_EPS
from core_triton.delta_rule.recurrent_bwd import delta_recurrent_bwd_kernel
from core_triton.delta_rule.recurrent_fwd import delta_recurrent_fwd_kernel

# A state tile holds about this many float32 values (one program's registers).
_STATE_TILE = 4096
# Below this many programs, value tiles shrink to raise parallelism.
_MIN_PROGRAMS = 264
# The forward kernel normalises q and k rows as it reads them (use_qk_l2norm)
# instead of after two l2norm launches: for decoding, two launches fewer
# per step (H100, B64 HV32 K=V=128, CUDA-graph replay: 106.3 us against
# 111.7; bench/probes/delta_step_sweep.py).
L2_IN_KERNEL = True
# Tokens between the backward's checkpoints (fewer under the interpreter, so
# the tests' short sequences span several blocks).
CHECKPOINT = 16
CHECKPOINT_INTERPRETED = 4


def tiles(K: int, V: int, heads: int) -> tuple[int, int]:
    """(BK, BV): all of K in one tile; value tiles as wide as the state tile
    allows, narrower (down to 16) while there are too few programs
    (``heads``: value heads of one sequence; never a batch size, which would
    compile a kernel per batch)."""
    bk = max(16, next_power_of_2(K))
    bv = min(max(16, next_power_of_2(V)), max(16, _STATE_TILE // bk))
    while bv > 16 and heads * cdiv(V, bv) < _MIN_PROGRAMS:
        bv //= 2
    return bk, bv


def _warps(bk: int, bv: int) -> int:
    tile = bk * bv
    return 4 if tile >= 4096 else 2 if tile >= 1024 else 1


def make_plans(a: DeltaRuleArgs, dtypes: dict[str, str]):
    """(forward, backward, offsets, residuals, inference) of a recurrent call;
    ``dtypes``: the dtype name of each optional input given (``g``, ``gk``,
    ``initial_state``)."""
    B, T, HK, HV, K, V, N, G = a.B, a.T, a.HK, a.HV, a.K, a.V, a.N, a.G
    bk, bv = tiles(K, V, HV)
    nv = cdiv(V, bv)
    interpreted = is_interpreted(delta_recurrent_fwd_kernel)
    cb = CHECKPOINT_INTERPRETED if interpreted else CHECKPOINT
    grid = (nv, N * HV) if N * HV else (0, 0)
    # Packed input: tokens no sequence covers (traced cu_seqlens that break
    # the contract) are visited by no program; zero-filled, they get output
    # 0 and gradient 0 (core_triton.common.sequences).
    token_fill = 0.0 if a.packed else None
    gate_name = {SCALAR_GATE: "g", 2: "gk"}.get(a.gate)
    use_h0 = "initial_state" in dtypes
    q, k = steps.query_key_names(a)

    def optional(name, present):
        return In(name) if present else In("value")  # an absent pointer: a dummy and a flag

    gates = (optional("g", a.gate == SCALAR_GATE), optional("gk", a.gate == 2))
    h0 = optional("initial_state", use_h0)
    cu = optional("cu_seqlens", a.packed)
    flags = dict(HK=HK, HV=HV, K=K, V=V, BK=bk, BV=bv, GATE=a.gate, USE_H0=use_h0, IS_VARLEN=a.packed)
    pre = steps.normalize(a)
    l2_here = a.l2norm and L2_IN_KERNEL
    qf, kf = ("query", "key") if l2_here else (q, k)
    forward = [
        *([] if l2_here else pre),
        LaunchPlan(
            kernel=delta_recurrent_fwd_kernel,
            grid=grid,
            params=(In(qf), In(kf), In("value"), In("beta"), *gates, h0, cu, T, a.scale),
            outputs=(OutputSpec((B, T, HV, V), a.dtype, token_fill), OutputSpec((N, HV, K, V), "float32")),
            output_names=("o", "final"),
            constexprs={**flags, "L2": l2_here, "EPS": L2NORM_EPS},
            num_warps=_warps(bk, bv),
            num_stages=1,
        ),
    ]

    rows = B * T
    nt = cdiv(T, cb)
    ns = nt + N if a.packed else N * nt
    unused = OutputSpec((1,), "float32")
    gate_shape = (nv, rows, HV, K) if a.gate == 2 else (nv, rows, HV)
    backward = [
        *pre,
        LaunchPlan(
            kernel=delta_recurrent_bwd_kernel,
            grid=grid,
            params=(
                In(q), In(k), In("value"), In("beta"), *gates, h0, In("do"), In("dht"), cu,
                optional("ckpt_offsets", a.packed), T, nt, ns, rows, a.scale,
            ),  # fmt: skip
            outputs=(
                OutputSpec((nv * G, rows, HK, K), "float32", token_fill),
                OutputSpec((nv * G, rows, HK, K), "float32", token_fill),
                OutputSpec((B, T, HV, V), a.dtype, token_fill),
                OutputSpec((nv, rows, HV), "float32", token_fill),
                OutputSpec(gate_shape, "float32", token_fill) if a.gate != NO_GATE else unused,
                OutputSpec((N, HV, K, V), dtypes["initial_state"]) if use_h0 else unused,
                OutputSpec((max(ns, 1), HV, K, V), "float32"),
                OutputSpec((max(N * HV * nv, 1), cb, bk, bv), "float32"),
            ),
            output_names=("dq_parts", "dk_parts", "d_value", "dbeta_parts", "dgate_parts", "d_initial_state",
                          "ckpt", "scratch"),  # fmt: skip
            constexprs={**flags, "CB": cb},
            num_warps=_warps(bk, bv),
            num_stages=1,
        ),
    ]  # fmt: skip
    backward += steps.gradient_sums(a, nv * G, nv, dtypes["beta"])
    if gate_name is not None:
        backward.append(
            reductions.reduce_partials_plan(
                "dgate_parts", nv, (B, T, *gate_shape[2:]), dtypes[gate_name], f"d_{gate_name}"
            )
        )
    offsets = (("ckpt_offsets", cb),) if a.packed else ()
    return tuple(forward), tuple(backward), offsets, (), ()
