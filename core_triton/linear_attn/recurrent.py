"""``recurrent``: linear attention with any mix of gates, token by token.

Semantics: docs/api.md#recurrent.  Shapes: query
``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``, g
``[B, T, H]``, g_gamma ``[H]``, gk ``[B, T, H, K]``, gv ``[B, T, H, V]``,
initial/final state ``[N, H, K, V]`` float32.  Returns output
``[B, T, HQ, V]`` (input dtype) and the final state.

Forward: one launch (recurrent_fwd).  Backward: one launch (recurrent_bwd)
that recomputes the states, then reductions (common/reductions.py) that sum the
per-value-tile partials and cast every gradient to its input's dtype.
Inputs are read contiguous (the bindings make them so).
"""

from __future__ import annotations

import functools

from core_triton.common import reductions
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.op import OpPlans
from core_triton.common.runtime import is_interpreted
from core_triton.common.utils import cdiv, next_power_of_2
from core_triton.linear_attn.args import LinearAttnArgs, linear_attn_plans, validate
from core_triton.linear_attn.recurrent_bwd import recurrent_bwd_kernel
from core_triton.linear_attn.recurrent_fwd import recurrent_fwd_kernel

GATES = ("g", "g_gamma", "gk", "gv")
# A state tile holds about this many float32 values (registers of one program).
_STATE_TILE = 4096
# Below this many programs, value tiles shrink to raise parallelism: every
# program walks its whole sequence, so programs, not bandwidth, set the pace.
_MIN_PROGRAMS = 264


def plans(
    query: TensorInfo,
    key: TensorInfo,
    value: TensorInfo,
    g: TensorInfo | None = None,
    g_gamma: TensorInfo | None = None,
    gk: TensorInfo | None = None,
    gv: TensorInfo | None = None,
    softmax_scale=None,
    initial_state: TensorInfo | None = None,
    reverse=False,
    cu_seqlens: TensorInfo | None = None,
) -> OpPlans:
    """Check the arguments and plan the launches."""
    a = validate(query, key, value, g, g_gamma, gk, gv, softmax_scale, initial_state, reverse, cu_seqlens)
    given = {"g": g, "g_gamma": g_gamma, "gk": gk, "gv": gv, "initial_state": initial_state}
    dtypes = {n: t.dtype for n, t in given.items() if t is not None}
    return _make_plans(a, tuple(sorted(dtypes.items())))


def _warps(bk: int, bv: int, backward: bool) -> int:
    """Warps per program, from the state tile's size (measured on an H100:
    2 for a 128 x 16 forward tile, 4 for the backward, which carries two
    tiles).  Fixed rather than autotuned so that both bindings run the
    same compiled code and agree bit for bit: the number of warps sets the
    order of the in-kernel sums."""
    tile = bk * bv * (2 if backward else 1)
    return 4 if tile >= 4096 else 2 if tile >= 1024 else 1


def tiles(K: int, V: int, programs: int) -> tuple[int, int]:
    """(BK, BV): all of K in one tile; value tiles as wide as the state tile
    allows, narrower (down to 16) while there are too few programs
    (``programs``: state heads of one sequence)."""
    bk = next_power_of_2(K)
    bv = min(next_power_of_2(V), max(16, _STATE_TILE // bk))
    while bv > 16 and programs * cdiv(V, bv) < _MIN_PROGRAMS:
        bv //= 2
    return bk, bv


# Plans depend on sizes, options and dtypes only: cache them for eager calls.
@functools.lru_cache(maxsize=512)
def _make_plans(a: LinearAttnArgs, dtypes: tuple[tuple[str, str], ...]) -> OpPlans:
    dtypes = dict(dtypes)
    B, T, HQ, H, K, V, N, G = a.B, a.T, a.HQ, a.H, a.K, a.V, a.N, a.G
    # Tiles from the head count alone: a block size that followed the batch
    # or the number of packed sequences would compile a new kernel whenever
    # packed training changes it.
    bk, bv = tiles(K, V, H)
    interpreted = is_interpreted(recurrent_fwd_kernel)
    # Packed input: tokens that no sequence covers (traced cu_seqlens that
    # break the contract) are visited by no program; zero-filled, they get
    # output 0 and gradient 0 (core_triton.common.sequences).
    token_fill = 0.0 if a.packed else None
    nv = cdiv(V, bv)
    grid = (nv, N * H)
    if N * H == 0:
        grid = (0, 0)

    def optional(name):
        return In(name) if name in dtypes else In("query")

    operands = (
        In("query"),
        In("key"),
        In("value"),
        optional("g"),
        optional("g_gamma"),
        optional("gk"),
        optional("gv"),
        optional("initial_state"),
    )
    index = In("cu_seqlens") if a.packed else In("query")
    flags = dict(
        H=H,
        G=G,
        K=K,
        V=V,
        BK=bk,
        BV=bv,
        USE_G="g" in dtypes,
        USE_G_GAMMA="g_gamma" in dtypes,
        USE_GK="gk" in dtypes,
        USE_GV="gv" in dtypes,
        USE_H0="initial_state" in dtypes,
        REVERSE=a.reverse,
        IS_VARLEN=a.packed,
    )
    forward = LaunchPlan(
        kernel=recurrent_fwd_kernel,
        grid=grid,
        params=(*operands, index, T, a.scale),
        outputs=(OutputSpec((B, T, HQ, V), a.dtype, token_fill), OutputSpec((N, H, K, V), "float32")),
        constexprs=flags,
        num_warps=_warps(bk, bv, backward=False),
        num_stages=1,
        output_names=("o", "final"),
    )

    rows = B * T
    unused = OutputSpec((1,), "float32")

    def partial(name, shape):
        if name in dtypes or name in ("query", "key"):
            return OutputSpec((nv, *shape), "float32", token_fill)
        return unused

    bwd_outputs = (
        partial("query", (B, T, HQ, K)),
        partial("key", (B, T, H, K)),
        OutputSpec((B, T, H, V), a.dtype, token_fill),
        partial("g", (B, T, H)),
        partial("gk", (B, T, H, K)),
        OutputSpec((B, T, H, V), "float32", token_fill) if "gv" in dtypes else unused,
        OutputSpec((N * nv, H), "float32") if "g_gamma" in dtypes else unused,
        OutputSpec((N, H, K, V), dtypes["initial_state"]) if "initial_state" in dtypes else unused,
    )
    backward = [
        LaunchPlan(
            kernel=recurrent_bwd_kernel,
            grid=grid,
            params=(*operands, In("do"), In("dht"), index, T, rows, a.scale),
            outputs=bwd_outputs,
            constexprs=flags,
            num_warps=_warps(bk, bv, backward=True),
            num_stages=1,
            output_names=(
                "dq_parts",
                "dk_parts",
                "d_value",
                "dg_parts",
                "dgk_parts",
                "dgv_f32",
                "dgamma_parts",
                "d_initial_state",
            ),
        ),
        reductions.reduce_partials_plan("dq_parts", nv, (B, T, HQ, K), a.dtype, "d_query"),
        reductions.reduce_partials_plan("dk_parts", nv, (B, T, H, K), a.dtype, "d_key"),
    ]
    if "g" in dtypes:
        backward.append(reductions.reduce_partials_plan("dg_parts", nv, (B, T, H), dtypes["g"], "d_g"))
    if "gk" in dtypes:
        backward.append(reductions.reduce_partials_plan("dgk_parts", nv, (B, T, H, K), dtypes["gk"], "d_gk"))
    if "gv" in dtypes:
        backward.append(reductions.reduce_partials_plan("dgv_f32", 1, (B, T, H, V), dtypes["gv"], "d_gv"))
    if "g_gamma" in dtypes:
        # N * nv partials: summed by run-time loops, so a new number of
        # packed sequences compiles nothing (a constexpr count did).
        backward += reductions.head_sum_plans(
            "dgamma_parts", N * nv, H, dtypes["g_gamma"], "d_g_gamma", interpreted
        )
    inputs = ("query", "key", "value", *(n for n in (*GATES, "initial_state") if n in dtypes))
    grads = tuple((n, f"d_{n}") for n in inputs)
    return linear_attn_plans(a, (forward,), tuple(backward), inputs, (), (), grads)
