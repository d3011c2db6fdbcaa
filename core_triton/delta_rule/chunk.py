"""``gated_delta_rule(mode="chunk")``: the launches, chunk-parallel.

Forward (chunks of ``CHUNK`` tokens that start at each sequence's first
token):

1. ``gc``: the in-chunk cumsum of ``g`` / ``gk`` (the cumsum kernel,
   float32); ``qn``, ``kn`` with ``use_qk_l2norm`` (l2norm.py);
2. ``tinv`` (and ``aqk``, ``gkk`` where a later launch reads them):
   per-chunk matrices (chunk_intra.py; for per-channel gates after the
   diagonal blocks of ``P`` and ``G``, chunk_diag.py), and for
   per-channel gates (or with ``WU_IN_WALK`` off, or beyond K = 128)
   ``w``, ``uv``, ``kd`` (chunk_fwd_wu.py);
3. ``o``, ``final``: one walk over the chunks carrying the state, which
   forms each chunk's delta updates and outputs on the way
   (chunk_fwd_walk.py; for scalar or no gates from ``tinv``, the values
   and beta); beyond K = 128, ``h``, ``u``, ``final`` (the state entering
   each chunk and the updates: chunk_fwd_state.py) and then ``o``
   (chunk_fwd_output.py); for packed input, zeros in the rows of ``o``
   that no chunk covers (common/sequences.py).

Backward (from ``do`` and ``dht``): step 2 again (the forward keeps ``gc``,
``qn`` and ``kn``, and for per-channel gates ``aqk``, ``gkk`` and ``tinv``,
which it then stores whether or not a later launch of its own reads them:
``KEEP_MATRICES``), ``h`` and ``u`` (chunk_fwd_state.py), then

5. ``dh``, ``du``, ``d_initial_state`` (chunk_bwd_state.py);
6. ``d_value``, beta's partial gradients and the ``[BT, BT]`` / extra terms
   of the query and key gradients (chunk_bwd_dv.py);
7. the query/key parts, and the gate's gradient (scalar gates) or the
   log-decay gradient ``db`` (per-channel gates) (chunk_bwd_dqk.py);
8. fixed-order sums of the parts (common/reductions.py), the reverse
   in-chunk cumsum of ``db`` into ``gk``'s gradient, and the
   normalisation's backward.
"""

from __future__ import annotations

import dataclasses

from core_triton.common import reductions, sequences
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import is_interpreted
from core_triton.common.utils import cdiv, contiguous_strides, next_power_of_2
from core_triton.cumsum import plan as cumsum_plan
from core_triton.delta_rule import steps
from core_triton.delta_rule.args import NO_GATE, SCALAR_GATE, VECTOR_GATE, DeltaRuleArgs
from core_triton.delta_rule.chunk_bwd_dqk import delta_chunk_bwd_dqk_kernel
from core_triton.delta_rule.chunk_bwd_dv import delta_chunk_bwd_dv_kernel
from core_triton.delta_rule.chunk_bwd_state import delta_chunk_bwd_state_kernel
from core_triton.delta_rule.chunk_diag import delta_chunk_diag_kernel
from core_triton.delta_rule.chunk_fwd_output import delta_chunk_fwd_output_kernel
from core_triton.delta_rule.chunk_fwd_state import delta_chunk_fwd_state_kernel
from core_triton.delta_rule.chunk_fwd_walk import delta_chunk_fwd_walk_kernel
from core_triton.delta_rule.chunk_fwd_wu import delta_chunk_fwd_wu_kernel
from core_triton.delta_rule.chunk_intra import delta_chunk_intra_kernel

# Tokens per chunk, and rows per block of the per-chunk matrices (tl.dot
# needs 16).  Tests may set CHUNK to 16 or 32 (more chunks in short inputs).
CHUNK = 64
BLOCK = 16

# Scalar (or no) gates, where the walk reads W and Uv (not WU_IN_WALK) or
# the output kernel forms the outputs: the forward's intra kernel stores P
# for them (True), or they form it from q k^T (False).  The walk that forms
# W S and Uv forms P too (its tiles' P_FROM_AQK; chunk_fwd_walk.py).
P_IN_INTRA = True

# The forward walks the chunks once for states and outputs
# (chunk_fwd_walk.py) up to K = 128 (True), or stores the states for the
# output kernel (False; what larger K takes).
FUSED_WALK = True

# Scalar (or no) gates: the fused walk forms W S and Uv itself from Tinv,
# the values and beta (chunk_fwd_walk.py), so the forward runs no W/Uv
# launch (True); or it reads them from chunk_fwd_wu.py (False).  Per-channel
# gates always read them (H100, KDA B4 T4k HV32 K=V=128 bf16: forward 3.59
# ms formed in the walk, which spilled, against 2.42; again with the
# kept per-chunk matrices: 2.86 against 2.20, forward+backward 11.87 against
# 11.20, and an illegal address at value tiles of 32 on 8 warps).
WU_IN_WALK = True

# Scalar (or no) gates: the forward's intra kernel forms G in one product
# per K tile, stores it and reads its blocks back (True), or forms each
# block of G from k's blocks (False).
G_WHOLE = True

# Per-channel gates: the W/Uv launch of the backward stores q exp(b) for the
# backward state pass (True), or that pass forms it (False).
Q_DECAYED = True

# Per-channel gates with half inputs and use_qk_l2norm: the forward's W/Uv
# launch stores Qd = q exp(b) in float16, which the walk reads in place of q
# and the float32 log decays b (True; 32 KB less shared memory a pipeline
# stage of the walk at K = V = 128), or the walk forms it (False).  With
# normalised queries every |Qd| is at most 1, so float16 holds it with 11
# significant bits, which the walk's tf32 product keeps whole (the float32
# product it forms otherwise loses the same bits there); bf16's 8 took the
# half-precision test's output error over its bound (1.04e-2).  Off (H100,
# KDA HV32 K=V=128 bf16, with P_FLOAT16, wall ms): B4 T4k forward 2.25
# against 2.12, B1 T32k in 16 documents forward 4.72 against 4.58 (the W/Uv
# launch's Qd store), forward+backward 21.87 against 22.02 (the training
# forward stores Qd anyway: KEEP_WU); value tiles of 128 on 8 warps were
# slower still (docs/benchmarks.md, twenty-fifth session).
WALK_READS_QD = False

# Half-precision inputs with use_qk_l2norm: the decayed scores P (aqk) stored
# in float16 (True) rather than float32 (False).  With normalised q and k
# every |P[i, j]| is at most about 1, so float16's 11 significant bits hold
# it, and the tf32 products that read it (the walk's or output kernel's P U,
# the backward state pass's P^T dO) keep them whole; the query/key gradient
# kernel's elementwise dP * P then carries 2^-12 of rounding.  Half the
# bytes of the intra kernel's P store and of every read of it (the walk, the
# backward state pass once per value tile, the query/key gradient kernel).
# Offline sm_90 builds (KDA K = V = 128 bf16): the walk's shared memory 172
# KB against 205 (its spills 268 bytes against 44), the backward state
# pass's 57 KB against 74.  Off: the walk took 0.93 ms against 0.67 (H100,
# KDA B4 T4k, forward 2.37 against 2.12 wall; docs/benchmarks.md,
# twenty-fifth session).
P_FLOAT16 = False

# Half-precision inputs: W, Uv, Kd and Qd (what the chunk kernels hand
# each other per token) stored in the inputs' dtype, and the walk's k S and
# k^T U products with S and U rounded to it (True); or those in float32 and
# the products with k widened instead (False).  Batched bf16 cases of the
# tests (T 70, K 20): no gate's final state 1.16e-2 of its scale and d_key
# 1.2e-2 with True, 5.3e-3 and 8.9e-3 with False (the recurrent mode: 5.3e-3
# and 6.9e-3); per-channel gates' final state 1.08e-2 against 3.5e-3.  On
# the H100 (B4 T4k HV32 K=V=128 bf16) False costs GDN's forward 1.32 ms of
# kernels against 1.05, its forward+backward 9.06 against 8.16, and a
# per-channel-gate launch asked for 272 KB of shared memory (its tiles
# would need shrinking).  Kept True; an option for tests and experiments.
HALF_INTERMEDIATES = True

# Per-channel gates: the query/key gradient kernel sums db into gk's
# gradient itself, walking a chunk's row blocks last first (True), or a
# launch of the cumsum kernel does (False: H100, KDA B4 T4k HV32 K=V=128
# bf16, True made that kernel 3.91 ms against 3.51, more than the 0.25 ms
# cumsum launch it saves).
SUM_DB_IN_DQK = False

# A forward that a backward follows keeps the per-chunk matrices P, G and
# Tinv (float32 [B, T, HV, BT] each) for it, which then does not form them
# again (True), or the backward forms them (False): per-channel gates only,
# whose matrices cost most to form (H100, KDA B4 T4k HV32 K=V=128 bf16:
# forward+backward 11.72 ms of kernels against 12.72 forming them again).
# They take 768 bytes per token and value head (fla keeps P and Tinv in
# the inputs' dtype; rounded, Tinv would change the gradients' error).
KEEP_MATRICES = True

# With KEEP_MATRICES: the forward that a backward follows also keeps W, Uv,
# Kd and Qd (the inputs' dtype for half inputs: 1 KB per token and value
# head at K = V = 128 bf16), so the backward runs no W/Uv launch (True; fla
# keeps them only with disable_recompute), or the backward forms them again
# (False).  H100, KDA B4 T4k HV32 K=V=128 bf16: forward+backward 10.81 ms
# wall against 11.22-11.23 (the forward's W/Uv launch 0.498 ms with Qd
# stored, against 0.38 without; the backward's 0.50 gone).
KEEP_WU = True

# Packed input: the chunk walks (the forward's walk and both state passes:
# a program per sequence and value head, walking its chunks in turn) start
# the longest sequences first (True: sequences.sequence_order_plan), or in
# index order (False).
ORDER_WALKS = True

# Tile sizes and launch options per kernel (keys: the names below); tests
# and benchmarks may override them.
TILE_OVERRIDES: dict[str, dict] = {}


def _tiles(kernel: str, K: int, V: int, interpreted: bool, gate: int = NO_GATE, ieee: bool = False) -> dict:
    kp, vp = max(16, next_power_of_2(K)), max(16, next_power_of_2(V))
    # The forward state pass takes value tiles of 64 up to K = 128 (measured on
    # the H100 at B4 T4k HV32 K=V=128: 0.44 ms against 0.48 ms with 32, which
    # reads W and Kd once more per chunk), 32 beyond (its float32 state
    # [K, BV] lives in registers); the backward one keeps 32.  Shared memory
    # (their loop loads W, Kd and Uv per chunk) sets the pipelining.
    t = {
        # The triangular inverse wants few warps (its row sums then stay
        # inside one: H100, B4 T4k HV32 K=V=128 bf16, scalar gates 0.60 ms
        # with 2 warps, 0.72 with 1, 0.79 with 4, while it still formed P
        # and G whole (0.39 ms since)).  Per-channel gates form the blocks
        # below the diagonal here too (KDA, same shape: 0.59 ms with K tiles
        # of 32 and 2 warps; 0.82 with 4 warps, 0.82 with tiles of 64, 0.75
        # with both, 0.73 with tiles of 16, 1.45 with 1 warp).  Per-channel
        # gates pipeline the K-tile loads of those blocks: 2 stages 0.523 ms
        # against 0.553-0.559, and 1.120 against 1.170-1.176 at B1 T32k in 16
        # documents (the whole forward 2.092 / 4.391 ms wall against
        # 2.120-2.123 / 4.439-4.448); scalar gates not measured.
        "intra": dict(
            BK=min(kp, 32 if gate == VECTOR_GATE else 64),
            num_warps=2,
            num_stages=2 if gate == VECTOR_GATE else 1,
            G_WHOLE=G_WHOLE and gate != VECTOR_GATE,
        ),
        # The diagonal blocks of P and G of per-channel gates, one per
        # program (KDA B4 T4k: 0.29 ms at 1 warp, 0.32 at 2, 0.47 at 4;
        # K tiles of 64 at 2 warps 0.31).
        "diag": dict(BK=min(kp, 32), num_warps=1, num_stages=1),
        # W / Uv / Kd: 0.32 ms there, 0.35 with 8 warps, 0.36 with 2 stages.
        "wu": dict(BK=min(kp, 64), BV=min(vp, 64), num_warps=4, num_stages=1),
        # The state passes hold all of K (the update needs every row).
        "state": dict(
            BK=kp, BV=min(vp, 64 if kp <= 128 else 32), num_warps=4, num_stages=2 if kp <= 128 else 1
        ),
        # The output kernel unpipelined: 0.31 ms less than 2 stages at B4 T4k
        # HV32 K=V=128 bf16 on the H100 (2.31 against 2.62 ms for the forward).
        "output": dict(BK=min(kp, 64), BV=min(vp, 64), num_warps=4, num_stages=1, P_FROM_AQK=P_IN_INTRA),
        # The forward walk, like the state pass (H100, GDN B4 T4k HV32
        # K=V=128 bf16: 0.58 ms, where the state pass and the output kernel
        # took 0.46 + 0.53; 8 warps, value tiles of 128 or forming P here
        # were slower: forward 1.59, 1.85 and 1.48 ms against 1.41).
        "walk": dict(
            BK=kp,
            BV=min(vp, 64 if kp <= 128 else 32),
            num_warps=4,
            num_stages=2 if kp <= 128 else 1,
            P_FROM_AQK=P_IN_INTRA,
        ),
        # The walk forming W S and Uv (WU_IN_WALK): unpipelined (H100, GDN
        # B4 T4k HV32 K=V=128 bf16: 0.62 ms, 0.82 with 2 stages, 0.90 with 8
        # warps), forming P from q k^T (forward 1.05 ms against 1.12 reading
        # it, B1 T32k in 16 documents 2.39 against 2.53: the intra kernel
        # then stores neither P nor its product).
        "walk_wu": dict(BK=kp, BV=min(vp, 64), num_warps=4, num_stages=1, P_FROM_AQK=False),
        # The backward state pass, from K = 128 on in two pieces of K
        # (chunk_bwd_state.py; KDA B4 T4k, q exp(b) read: 0.92 ms with
        # pieces of 64 and value tiles of 64; all of K at once 1.11 with
        # value tiles of 32, 1.20 with 2 stages, 1.37 with tiles of 64 and 2
        # stages; pieces of 64 with tiles of 32 1.27, 2 stages 1.17, 3
        # stages 1.14, 8 warps 1.43).
        "state_bwd": dict(
            BK=kp // 2 if kp >= 128 else kp,
            BV=min(vp, 64 if kp <= 128 else 32),
            num_warps=4,
            num_stages=2 if kp <= 64 else 1,
        ),
        "bwd_dv": dict(BK=min(kp, 64), BV=min(vp, 64), num_warps=8, num_stages=1),
    }[kernel]
    # Float32 inputs multiply in exact FMA loops, which spill: the GPU
    # reserves local memory for every resident thread of such a kernel at
    # launch, and the GPU tests' processes ran out of memory reserving it
    # (H100, Triton 3.6, K = V = 256: 16 KB a thread in the forward state
    # pass, 28 KB in the backward one; offline sm_90 builds at K = 128: up
    # to 42 KB in the walk, 28 KB in the backward state pass).  Smaller
    # tiles bound it (K = 256 on the H100: 2.7 and 6.6 KB; offline at K =
    # 128: 4 KB at most; the walk not at all: chunk.make_plans).  tf32x3
    # products spilled less, but Triton 3.6 miscompiled them (illegal
    # addresses, wrong gradients).
    if ieee:
        if kernel == "intra":
            t.update(BK=min(t["BK"], 32), num_warps=4, num_stages=1)
        if kernel in ("state", "state_bwd"):
            t.update(BV=min(t["BV"], 16), num_warps=8)
        if kernel in ("wu", "bwd_dv", "output"):
            t.update(BK=min(t["BK"], 32), BV=min(t["BV"], 32))
    if interpreted:
        # Tiles of 32 still cross tile edges at the tests' head dims.
        tiled_k = ("intra", "diag", "wu", "output", "bwd_dv")
        t["BK"] = min(t["BK"], 32 if kernel in tiled_k else t["BK"])
        if "BV" in t:  # the intra kernel has no value tiles
            t["BV"] = min(t["BV"], 32)
    t = {**t, **TILE_OVERRIDES.get(kernel, {})}
    if kernel == "state_bwd" and 2 * t["BK"] < K:
        # (its kernel holds at most two pieces of K)
        raise ValueError(f"state_bwd tiles: BK={t['BK']} leaves rows of K={K} out (at most two pieces)")
    return t


def _info(shape, dtype) -> TensorInfo:
    return TensorInfo(tuple(shape), dtype, contiguous_strides(shape))


def _unfilled(plan: LaunchPlan) -> LaunchPlan:
    """``plan`` with its outputs allocated unfilled."""
    return dataclasses.replace(plan, outputs=tuple(dataclasses.replace(o, fill=None) for o in plan.outputs))


def _renamed(plan: LaunchPlan, inputs: dict[str, str], outputs: tuple[str, ...]) -> LaunchPlan:
    params = tuple(In(inputs.get(p.name, p.name)) if isinstance(p, In) else p for p in plan.params)
    return dataclasses.replace(plan, params=params, output_names=outputs)


def make_plans(a: DeltaRuleArgs, dtypes: dict[str, str]):
    """(forward, backward, offsets, residuals, inference) of a chunk call;
    ``dtypes``: the dtype name of ``beta`` and of each optional input
    given."""
    B, T, HK, HV, K, V, N, G = a.B, a.T, a.HK, a.HV, a.K, a.V, a.N, a.G
    BT = CHUNK
    NT = cdiv(T, BT)
    # Chunk slots (of the chunk-state buffers): packed input gets an upper
    # bound known from shapes alone, so traced cu_seqlens work under jax.jit.
    NS = NT + N if a.packed else B * NT
    # Chunk slots per batch row, the per-chunk launches' first grid axis
    # (their second is batch row x head).  Batched input once took NS here:
    # B times the programs, all but one in B returning at once (H100, KDA B4
    # T4k: 24576 idle programs a launch, 98304 in the diagonal blocks').
    NG = NT + N if a.packed else NT
    n_iter = max(N, 1).bit_length() + 1
    rows = B * T
    ieee = a.dtype == "float32"
    # Half-precision inputs keep W, Uv and Kd (which the state pass reads once
    # per value tile) in their own dtype: half the bytes, and the tensor
    # cores' native products (the state and every sum stay float32).  The
    # states h and the updates U stay float32: rounded too, the output's
    # error against float64 went from 0.9e-2 to 1.5e-2 of its scale in the
    # half-precision test (its inter- and intra-chunk parts partly cancel).
    # Float32 inputs keep float32 throughout.
    inter = "float32" if ieee or not HALF_INTERMEDIATES else a.dtype
    interpreted = is_interpreted(delta_chunk_intra_kernel)
    empty = rows == 0
    gate = {SCALAR_GATE: "g", VECTOR_GATE: "gk"}.get(a.gate)
    use_h0 = "initial_state" in dtypes
    q, k = steps.query_key_names(a)

    def optional(name, present):
        return In(name) if present else In("value")  # an absent pointer: a dummy and a flag

    gc = optional("gc", gate is not None)
    cu = optional("cu_seqlens", a.packed)
    co = optional("chunk_offsets", a.packed)
    order = optional("seq_order", a.packed)
    flags = dict(HK=HK, HV=HV, K=K, V=V, BT=BT, GATE=a.gate, IS_VARLEN=a.packed, IEEE=ieee)
    slot_sizes = (T, N, n_iter, NT, NS)
    per_chunk = OutputSpec((B, T, HV, BT), "float32")
    # P (aqk): float32, or float16 (P_FLOAT16: |P| <= 1 with normalised q, k)
    p_spec = OutputSpec((B, T, HV, BT), "float16" if P_FLOAT16 and a.l2norm and not ieee else "float32")

    def tiled(name, kernel, grid, params, outputs, output_names, constexprs, drop=(), tiles=None):
        t = _tiles(tiles or name, K, V, interpreted, a.gate, ieee)
        warps, stages = t.pop("num_warps"), t.pop("num_stages")
        for key in drop:
            t.pop(key)
        return LaunchPlan(
            kernel=kernel,
            grid=(0,) * len(grid(t)) if empty else grid(t),
            params=params,
            outputs=outputs,
            output_names=output_names,
            constexprs={**constexprs, **t},
            num_warps=warps,
            num_stages=stages,
        )

    pre = []
    if gate is not None:
        shape = (B, T, HV) if a.gate == SCALAR_GATE else (B, T, HV, K)
        cum = cumsum_plan.make_plans(
            _info(shape, dtypes[gate]),
            _info((N + 1,), "int32") if a.packed else None,
            chunk=BT,
            reverse=False,
            scale=None,
            head_first=False,
            out_dtype="float32",
        )
        # Unfilled: the kernels read gc only in rows of chunks that have a
        # slot, the rows the cumsum writes (the packed cumsum's zero fill for
        # the others cost 0.12 ms of KDA's forward at B1 T32k on the H200).
        pre += [_renamed(_unfilled(p), {"x": gate}, ("gc",)) for p in cum.forward]
    if a.packed:
        pre.append(sequences.sequence_order_plan(N, T, BT, "seq_order", sort=ORDER_WALKS))
    normalize = steps.normalize(a)

    # Beyond K = 128 the walk's state and query tiles spill (up to 1.7 KB a
    # thread at K = 256), and Triton 3.6 miscompiled its scalar-gate variant
    # there (compute-sanitizer on the H100: an out-of-range shared address
    # in a product): the state pass and the output kernel take it, as they
    # do for compiled float32 inputs (the walk's exact products spilled:
    # _tiles; the interpreter keeps the walk, which its float32 tests hold
    # to 1e-5).
    fused = FUSED_WALK and K <= 128 and not (ieee and not interpreted)
    wu_here = fused and WU_IN_WALK and a.gate != VECTOR_GATE
    # Whether the kernel that forms the outputs reads P from the intra kernel.
    outputs_by = "walk_wu" if wu_here else "walk" if fused else "output"
    p_stored = a.gate == VECTOR_GATE or _tiles(outputs_by, K, V, interpreted, a.gate)["P_FROM_AQK"]
    g_whole = _tiles("intra", K, V, interpreted, a.gate)["G_WHOLE"]

    def intra_plan(store_bwd):
        # The forward stores P only for a kernel that reads it (p_stored),
        # and G (scalar or no gates, with G_WHOLE) only to read its blocks
        # back; the backward, which runs this again, needs both whole.
        scratch = OutputSpec((1,), "float32")
        if a.gate == VECTOR_GATE:
            # Per-channel gates: the diagonal blocks of P and G from their own
            # launch, the intra kernel forms the others and inverts.
            diag_spec = OutputSpec((B, T, HV, BLOCK), "float32")
            diag = tiled(
                "diag",
                delta_chunk_diag_kernel,
                lambda t: (NG, B * HV, BT // BLOCK),
                params=(In(q), In(k), gc, cu, co, *slot_sizes),
                outputs=(diag_spec, diag_spec),
                output_names=("pdiag", "gdiag"),
                constexprs=dict(HK=HK, HV=HV, K=K, BT=BT, BC=BLOCK, IS_VARLEN=a.packed, IEEE=ieee),
            )
            intra = tiled(
                "intra",
                delta_chunk_intra_kernel,
                lambda t: (NG, B * HV),
                params=(In(q), In(k), In("beta"), gc, In("pdiag"), In("gdiag"), cu, co, *slot_sizes),
                outputs=(p_spec, per_chunk if store_bwd else scratch, per_chunk),
                output_names=("aqk", "gkk", "tinv"),
                constexprs=dict(flags, BC=BLOCK, STORE_BWD=store_bwd, STORE_P=True),
            )
            return (diag, intra)
        full_g = store_bwd or g_whole
        full_p = store_bwd or p_stored
        intra = tiled(
            "intra",
            delta_chunk_intra_kernel,
            lambda t: (NG, B * HV),
            # (no diagonal blocks to read: dummy pointers)
            params=(In(q), In(k), In("beta"), gc, In("value"), In("value"), cu, co, *slot_sizes),
            outputs=(p_spec if full_p else scratch, per_chunk if full_g else scratch, per_chunk),
            output_names=("aqk", "gkk", "tinv"),
            constexprs=dict(flags, BC=BLOCK, STORE_BWD=store_bwd, STORE_P=p_stored),
        )
        return (intra,)

    def wu_plan(store_kd, store_qd=False, qd_dtype=inter):
        return tiled(
            "wu",
            delta_chunk_fwd_wu_kernel,
            lambda t: (NG, B * HV),
            params=(In(q), In(k), In("value"), In("beta"), gc, In("tinv"), cu, co, *slot_sizes),
            outputs=(
                OutputSpec((B, T, HV, K), inter),
                OutputSpec((B, T, HV, V), inter),
                OutputSpec((B, T, HV, K), inter) if store_kd else OutputSpec((1,), inter),
                OutputSpec((B, T, HV, K), qd_dtype) if store_qd else OutputSpec((1,), inter),
            ),
            output_names=("w", "uv", "kd", "qd"),
            constexprs=dict(flags, STORE_KD=store_kd, STORE_QD=store_qd),
        )

    # The backward's state pass reads q exp(b) for per-channel gates (its
    # decays formed once, not on the pass's serial walk once per value tile:
    # H100, KDA B4 T4k HV32 K=V=128 bf16, that pass took 2.40 ms).
    q_decayed = a.gate == VECTOR_GATE and Q_DECAYED
    wu = wu_plan(True, q_decayed)
    # The walk of scalar (or no) gates reads k, not Kd (chunk_fwd_walk.py).
    store_kd = not fused or a.gate == VECTOR_GATE
    state = tiled(
        "state",
        delta_chunk_fwd_state_kernel,
        lambda t: (cdiv(V, t["BV"]), N * HV),
        params=(In("kd"), In("w"), In("uv"), gc, optional("initial_state", use_h0), cu, co, order, T, NT, NS),
        outputs=(
            OutputSpec((max(NS, 1), HV, K, V), "float32"),
            OutputSpec((B, T, HV, V), "float32"),
            OutputSpec((N, HV, K, V), "float32"),
        ),
        output_names=("h", "u", "final"),
        constexprs=dict(flags, USE_H0=use_h0),
    )
    output = tiled(
        "output",
        delta_chunk_fwd_output_kernel,
        lambda t: (cdiv(V, t["BV"]), NG, B * HV),
        params=(In(q), In(k), gc, In("h"), In("aqk"), In("u"), cu, co, a.scale, *slot_sizes),
        outputs=(OutputSpec((B, T, HV, V), a.dtype),),
        output_names=("o",),
        constexprs=flags,
    )
    # (the walk of per-channel gates reading Qd in float16: WALK_READS_QD)
    walk_qd = fused and a.gate == VECTOR_GATE and WALK_READS_QD and a.l2norm and not ieee
    walk = tiled(
        "walk",
        delta_chunk_fwd_walk_kernel,
        lambda t: (cdiv(V, t["BV"]), N * HV),
        params=(
            In("qd" if walk_qd else q),
            In(k),
            optional("kd", not wu_here),
            optional("w", not wu_here),
            optional("uv", not wu_here),
            In("value"),
            In("beta"),
            In("tinv"),
            gc,
            In("aqk"),
            optional("initial_state", use_h0),
            cu,
            co,
            order,
            a.scale,
            T,
            NT,
            NS,
        ),  # fmt: skip
        outputs=(OutputSpec((B, T, HV, V), a.dtype), OutputSpec((N, HV, K, V), "float32")),
        output_names=("o", "final"),
        constexprs=dict(
            flags, USE_H0=use_h0, WU_HERE=wu_here, WIDE=not (ieee or HALF_INTERMEDIATES), Q_DECAYED=walk_qd
        ),
        tiles="walk_wu" if wu_here else "walk",
    )
    tail = (walk,) if fused else (state, output)

    def uncovered(plan, names):
        # Packed input: the rows of these outputs of ``plan`` (their time
        # axis second) that no chunk slot covers (traced cu_seqlens that
        # break the contract) get 0 from a launch that writes only those
        # rows, instead of a zero fill of the whole output before the
        # kernels write it again (H100, B1 T32k HV32 V128 bf16: the forward
        # output's 0.08 ms, 3% of the forward).
        if not a.packed:
            return ()
        specs = dict(zip(plan.output_names, plan.outputs, strict=True))
        return tuple(
            sequences.zero_uncovered_plan(n, specs[n].shape, specs[n].dtype, 1, N, BT, NS) for n in names
        )

    keep = KEEP_MATRICES and a.gate == VECTOR_GATE
    # (per-channel gates: the forward's W/Uv launch stores Kd already)
    keep_wu = keep and KEEP_WU

    def forward_plans(store_bwd):
        # Qd for the walk (WALK_READS_QD), or kept for the backward (KEEP_WU)
        store_qd = walk_qd or (store_bwd and keep_wu and q_decayed)
        wu_fwd = () if wu_here else (wu_plan(store_kd, store_qd, "float16" if walk_qd else inter),)
        return (
            *pre,
            *normalize,
            *intra_plan(store_bwd),
            *wu_fwd,
            *tail,
            *uncovered(tail[-1], ("o",)),
        )

    forward = forward_plans(keep)
    # A call no gradient follows stores only what the forward reads.
    inference = forward_plans(False) if keep else ()

    bwd_t = _tiles("bwd_dv", K, V, interpreted, ieee=ieee)
    NK = cdiv(K, bwd_t["BK"])
    state_bwd = tiled(
        "state_bwd",
        delta_chunk_bwd_state_kernel,
        lambda t: (cdiv(V, t["BV"]), N * HV),
        params=(
            In("qd" if q_decayed else q),
            *(In("kd"), In("w"), gc, In("aqk"), In("do"), In("dht"), cu, co, order, a.scale, T, NT, NS),
        ),
        outputs=(
            OutputSpec((max(NS, 1), HV, K, V), "float32"),
            OutputSpec((B, T, HV, V), "float32"),
            OutputSpec((N, HV, K, V), dtypes["initial_state"]) if use_h0 else OutputSpec((1,), "float32"),
        ),
        output_names=("dh", "du", "d_initial_state"),
        constexprs=dict(flags, USE_H0=use_h0, Q_DECAYED=q_decayed),
    )
    dblast_spec = {
        NO_GATE: OutputSpec((1,), "float32"),
        SCALAR_GATE: OutputSpec((NK, max(NS, 1), HV), "float32"),
        VECTOR_GATE: OutputSpec((max(NS, 1), HV, K), "float32"),
    }[a.gate]
    extra = OutputSpec((B, T, HV, K), "float32")
    bwd_dv = tiled(
        "bwd_dv",
        delta_chunk_bwd_dv_kernel,
        lambda t: (NK, NG, B * HV),
        params=(
            In(k),
            In("value"),
            In("beta"),
            gc,
            In("tinv"),
            In("gkk"),
            In("h"),
            In("u"),
            In("do"),
            In("dh"),
            In("du"),
            cu,
            co,
            a.scale,
            *slot_sizes,
            rows,
        ),  # fmt: skip
        outputs=(
            OutputSpec((B, T, HV, V), a.dtype),
            OutputSpec((NK, rows, HV), "float32"),
            per_chunk,
            per_chunk,
            extra,
            extra,
            extra,
            dblast_spec,
        ),
        output_names=("d_value", "dbeta_parts", "dp", "dg", "dq_extra", "dkp_extra", "dkm_extra", "dblast"),
        constexprs=flags,
    )
    sum_db = a.gate == VECTOR_GATE and SUM_DB_IN_DQK
    db_spec = {
        NO_GATE: OutputSpec((1,), "float32"),
        SCALAR_GATE: OutputSpec((NK, rows, HV), "float32"),
        VECTOR_GATE: OutputSpec((B, T, HV, K), dtypes["gk"] if sum_db else "float32"),
    }[a.gate]
    db_name = "d_gk" if sum_db else "db_parts"
    bwd_dqk = tiled(
        "bwd_dv",
        delta_chunk_bwd_dqk_kernel,
        lambda t: (NK, NG, B * HV),
        params=(
            In(q),
            In(k),
            gc,
            In("aqk"),
            In("gkk"),
            In("dp"),
            In("dg"),
            In("dq_extra"),
            In("dkp_extra"),
            In("dkm_extra"),
            optional("dblast", a.gate != NO_GATE),
            cu,
            co,
            *slot_sizes,
            rows,
        ),  # fmt: skip
        outputs=(
            OutputSpec((G, rows, HK, K), "float32"),
            OutputSpec((G, rows, HK, K), "float32"),
            db_spec,
        ),
        output_names=("dq_parts", "dk_parts", db_name),
        constexprs=dict(
            HK=HK, HV=HV, K=K, BT=BT, BC=BLOCK, GATE=a.gate, IS_VARLEN=a.packed, IEEE=ieee, SUM_DB=sum_db
        ),
        drop=("BV",),
    )
    # (qn and kn come from the forward: residuals below.)
    backward = [
        *(() if keep else intra_plan(True)),
        *(() if keep_wu else (wu,)),
        state,
        state_bwd,
        bwd_dv,
        *uncovered(bwd_dv, ("d_value", "dbeta_parts")),
        bwd_dqk,
        *uncovered(
            bwd_dqk, ("dq_parts", "dk_parts", db_name) if a.gate != NO_GATE else ("dq_parts", "dk_parts")
        ),
    ]
    backward += steps.gradient_sums(a, G, NK, dtypes["beta"])
    offsets = [("chunk_offsets", BT)] if a.packed else []
    if a.gate == SCALAR_GATE:
        # The kernel sums dg itself (partials over K tiles).
        backward.append(reductions.reduce_partials_plan("db_parts", NK, (B, T, HV), dtypes["g"], "d_g"))
    elif a.gate == VECTOR_GATE and not sum_db:
        cum = cumsum_plan.make_plans(
            _info((B, T, HV, K), "float32"),
            _info((N + 1,), "int32") if a.packed else None,
            chunk=BT,
            reverse=True,
            scale=None,
            head_first=False,
            out_dtype=dtypes["gk"],
        )
        backward += [_renamed(p, {"x": "db_parts"}, ("d_gk",)) for p in cum.forward]
    residuals = ("gc",) if gate is not None else ()
    if a.packed:
        residuals += ("seq_order",)
    if a.l2norm:
        # The normalised query and key (in the inputs' dtype: a quarter of
        # q, k, v and the gate's bytes at HV = 2 HK), not normalised again.
        residuals += ("qn", "kn")
    if keep:
        residuals += ("aqk", "gkk", "tinv")
    if keep_wu:
        residuals += ("w", "uv", "kd") + (("qd",) if q_decayed else ())
    return tuple(forward), tuple(backward), tuple(offsets), residuals, inference
