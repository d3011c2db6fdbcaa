"""Launch plans: grids sized from shapes alone, every slot accounted for."""

import itertools

import pytest

from core_triton import TensorInfo, cdiv
from core_triton.attention import flash, flash_configs, flash_tma_plans, ring
from core_triton.common.launch import In
from core_triton.common.utils import contiguous_strides
from core_triton.cumsum import chunk_global as chunk_global_cumsum
from core_triton.cumsum import chunk_local as chunk_local_cumsum
from core_triton.cumsum.plan import _GLOBAL_CHUNK, _GLOBAL_CHUNK_INTERPRETED


def _info(shape, dtype="float32"):
    return TensorInfo(shape, dtype, contiguous_strides(shape))


def _tiles(plan_or_config) -> tuple:
    """``(BM, BN, num_warps, num_stages, maxnreg)`` of a plan or a config
    (``maxnreg`` None where the config has no fifth element)."""
    if isinstance(plan_or_config, tuple):
        return flash_configs.unpack(plan_or_config)
    p = plan_or_config
    return (p.constexprs["BM"], p.constexprs["BN"], p.num_warps, p.num_stages, p.maxnreg)


CAPPED = (128, 64, 8, 3, 128)  # 8 warps at most 128 registers a thread


def test_local_grid_covers_every_chunk_of_packed_input():
    # N sequences add at most N partial chunks to cdiv(T, chunk).
    cu = _info((5,), "int32")
    p, zero = chunk_local_cumsum.plans(_info((1, 1000, 4)), 64, cu_seqlens=cu).forward
    assert p.grid[0] == cdiv(1000, 64) + 4
    assert p.constexprs["BT"] == 64 and p.outputs[0].shape == (1, 1000, 4)
    # The launch that zeroes what no window covers knows the same slots.
    assert zero.params[-1] == p.grid[0] and zero.constexprs["CHUNK"] == 64


def test_backward_plan_flips_direction_and_keeps_input_dtype():
    plans = chunk_local_cumsum.plans(_info((2, 10, 3), "bfloat16"), 8, reverse=True, output_dtype="float32")
    (back,) = plans.backward(_info((2, 10, 3), "float32"))
    assert plans.forward[0].constexprs["REVERSE"] and not back.constexprs["REVERSE"]
    assert back.outputs[0].dtype == "bfloat16" and plans.forward[0].outputs[0].dtype == "float32"


def test_global_scan_is_two_launches_over_fixed_chunks():
    # Chunk totals, then scans that start from them; the chunk length is
    # fixed, whatever the length and the number of rows.
    chunks = set()
    for shape in ((8, 65536, 16), (8, 1000, 16, 128), (1, 37, 2)):
        split = chunk_global_cumsum.plans(_info(shape)).forward
        assert [p.constexprs["PASS"] for p in split] == [1, 2]
        assert split[0].output_names == ("totals",) and split[0].outputs[0].dtype == "float32"
        chunks |= {p.constexprs["CHUNK"] for p in split}
    assert len(chunks) == 1 and chunks <= {_GLOBAL_CHUNK, _GLOBAL_CHUNK_INTERPRETED}
    split = chunk_global_cumsum.plans(_info((8, 65536, 16))).forward
    assert split[1].grid[0] * split[1].grid[1] * split[1].grid[2] >= 1024


def test_packed_outputs_are_zeroed_where_no_window_covers():
    # Tokens outside every sequence (traced cu_seqlens past seq_len) are
    # written by no scan; the public ops' plans leave the output unfilled
    # and zero those rows in a last launch (in place), in both directions.
    # Ops that take the scan as a step keep a zero-filled output.
    from core_triton.common.sequences import zero_uncovered_kernel
    from core_triton.cumsum import plan as cumsum_plan

    cu = _info((5,), "int32")
    x = _info((1, 100, 4))
    local = chunk_local_cumsum.plans(x, 16, cu_seqlens=cu)
    for plans in (local, chunk_global_cumsum.plans(x, cu_seqlens=cu)):
        for steps in (plans.forward, plans.backward(x)):
            assert steps[-1].kernel is zero_uncovered_kernel and steps[-1].aliases == ((0, "out"),)
            assert all(o.fill is None for p in steps for o in p.outputs)
    (p,) = chunk_local_cumsum.plans(_info((2, 100, 4)), 16).forward
    assert p.outputs[0].fill is None
    (p,) = cumsum_plan.make_plans(
        x, cu, chunk=16, reverse=False, scale=None, head_first=False, out_dtype="float32"
    ).forward
    assert p.outputs[0].fill == 0.0


def test_cached_planners_still_check_every_call():
    """flash and ring plans are cached per argument set, and the cache never
    hides a check: a list window is a pair, 1 is no bool, an unhashable
    argument gets its check's own error."""
    q = TensorInfo((1, 8, 2, 16), "float32", (256, 32, 16, 1))
    assert flash.plans(q, q, q, sliding_window=[3, 4], causal=True) is flash.plans(
        q, q, q, sliding_window=(3, 4), causal=True
    )
    assert ring.plans(q, q, q, 2, False, sliding_window=[3, 4]) is ring.plans(
        q, q, q, 2, False, sliding_window=(3, 4)
    )
    for planner, extra in ((flash.plans, ()), (ring.plans, (2, False))):
        planner(q, q, q, *extra, causal=True)
        with pytest.raises(TypeError, match="causal"):
            planner(q, q, q, *extra, causal=1)
        with pytest.raises(TypeError, match="sliding_window"):
            planner(q, q, q, *extra, sliding_window=([1], 2))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_head_dim_256_takes_fixed_configs_on_a_gpu(dtype, monkeypatch):
    """Past head dim 128 a GPU runs fixed configs, never an autotuning sweep:
    bf16 the measured ones when plain or causal, float32 its one small config
    with every feature (the bias gradient included)."""
    monkeypatch.setattr(flash, "interpreter_requested", lambda: False)
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    flash.attention_plans.cache_clear()
    try:
        q = _info((1, 1024, 4, 256), dtype)
        bias = _info((1, 4, 1024, 1024))
        for extra in ({}, {"causal": True}, {"bias": bias}, {"sliding_window": 16}):
            plans, _ = flash.plans(q, q, q, **extra)
            launches = {"fwd": plans.forward, **dict(zip(("dkdv", "dq"), plans.grads(q, q), strict=True))}
            launches = {kind: steps[0] for kind, steps in launches.items()}  # one launch each (no ranges)
            if "bias" in extra:
                launches["dbias"] = plans.dbias(q)
            for kind, plan in launches.items():
                got = (plan.constexprs["BM"], plan.constexprs["BN"], plan.num_warps, plan.num_stages)
                if dtype == "float32":
                    assert got == flash_configs.FLOAT32_256, (extra, kind, got)
                elif not extra or "causal" in extra:
                    assert got == flash_configs.MEASURED_256[kind], (extra, kind, got)
                assert not hasattr(plan.kernel, "configs"), (extra, kind)  # no autotuner
    finally:
        flash.attention_plans.cache_clear()


@pytest.mark.parametrize("D", [16, 64, 128])
def test_no_gpu_plan_autotunes(D, monkeypatch):
    """On a GPU no plain or causal plan autotunes: half precision takes the
    measured tiles (flash_configs.measured_choice; head dim 64's depend on
    the mask, the length and the dK/dV split), float32 (FMA products) at
    head dims up to 64 the features' fixed config."""
    monkeypatch.setattr(flash, "interpreter_requested", lambda: False)
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    flash.attention_plans.cache_clear()
    try:
        c = flash_configs
        for dtype in ("float32", "bfloat16"):
            q = _info((2, 300, 4, D), dtype)
            for causal in (False, True):
                plans, _ = flash.plans(q, q, q, causal=causal)
                launches = zip(
                    ("fwd", "dkdv", "dq"), (plans.forward[0], *(g[0] for g in plans.grads(q, q))), strict=True
                )
                for kind, plan in launches:
                    assert not hasattr(plan.kernel, "configs"), (dtype, causal, plan.kernel)
                    got = _tiles(plan)
                    table = c.CONFIGS[kind][64]
                    if D == 128:
                        want = flash_configs.measured_choice(kind, 128, causal, 300, 300)
                    elif dtype == "bfloat16":  # a group of 1: no dK/dV split
                        want = flash_configs.measured_choice(kind, 64, causal, 300, 300, False, 1)
                    else:
                        want = table[min(flash_configs.FIXED[64], len(table) - 1)]
                    assert got == _tiles(want), (dtype, causal, kind, got)
    finally:
        flash.attention_plans.cache_clear()


@pytest.mark.parametrize(
    "kind, causal, length, ranged, splits, want",
    [
        ("fwd", True, 4096, False, 1, (64, 64, 4, 4)),
        ("fwd", True, 2048, False, 1, CAPPED),
        ("fwd", True, 8192, False, 1, CAPPED),
        ("fwd", True, 16384, False, 1, CAPPED),
        ("fwd", False, 8192, False, 1, CAPPED),
        ("fwd", True, 1024, False, 1, (64, 64, 4, 4)),
        ("fwd", False, 1024, False, 1, (128, 64, 4, 3)),
        ("fwd", True, 4096, True, 1, (128, 64, 4, 3)),
        ("fwd", False, 8192, True, 1, (128, 64, 4, 3)),
        ("dq", True, 4096, True, 1, (64, 64, 4, 3)),
        ("dq", False, 8192, True, 1, (64, 64, 4, 3)),
        ("dq", True, 8192, False, 1, (64, 64, 4, 3)),
        ("dq", False, 2048, False, 1, CAPPED),
        ("dq", False, 1024, False, 1, (64, 64, 4, 3)),
        ("dkdv", True, 4096, False, None, None),
        ("dkdv", True, 1024, False, 1, (64, 64, 4, 3)),
        ("dkdv", True, 2048, False, 8, (32, 64, 4, 3)),
        ("dkdv", True, 2048, False, 1, (32, 64, 4, 3)),
        ("dkdv", False, 8192, False, 1, (32, 64, 4, 3)),
        ("dkdv", True, 16384, False, 1, (32, 64, 4, 3)),
        ("dkdv", True, 4096, False, 8, (32, 64, 4, 3)),
        ("dkdv", False, 4096, False, 8, (32, 128, 4, 3)),
        ("dkdv", True, 16384, False, 8, (32, 128, 4, 3)),
        ("dkdv", True, 4096, True, 8, (32, 64, 4, 3)),
        ("dkdv", True, 16384, True, 8, (32, 128, 4, 3)),
        ("dkdv", False, 1024, False, 1, (32, 128, 4, 3)),
    ],
)
def test_head_dim_64_measured_tiles(kind, causal, length, ranged, splits, want, monkeypatch):
    """Head dim 64's measured tiles by mask, length class, ranged kernel and
    dK/dV split (None while the split is sized: it is sized on 64 keys a
    block, as when autotuned), each one of the candidates the GPU suite
    checks (a register cap included); float32 takes none."""
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    got = flash_configs.measured_choice(kind, 64, causal, length, length // 2, ranged, splits)
    assert got == want
    if want is not None:
        assert want in flash_configs.CONFIGS[kind][64]
    assert flash_configs.measured_choice(kind, 64, causal, length, length, ranged, splits, half=False) is None


@pytest.mark.parametrize("causal", [False, True])
def test_register_caps_single_device_only(causal, monkeypatch):
    """Head dim 64 at 8k: the single-device forward runs 8 warps capped at
    128 registers (and, full, the dQ launch too); the ring's blocks (float32
    partials, never measured with a cap) keep the uncapped tiles of
    before."""
    monkeypatch.setattr(flash, "interpreter_requested", lambda: False)
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    flash.attention_plans.cache_clear()
    try:
        q = _info((1, 8192, 4, 64), "bfloat16")
        plans, _ = flash.plans(q, q, q, causal=causal)
        _, (dq, *_) = plans.grads(q, q)
        assert _tiles(plans.forward[0]) == CAPPED
        assert _tiles(dq) == ((64, 64, 4, 3, None) if causal else CAPPED)
        step, _, _ = ring.plans(q, q, q, 2, False, causal=causal)
        _, (ring_dq, *_) = step.grads(q, q)
        assert _tiles(step.forward[0]) == ((64, 64, 4, 4, None) if causal else (128, 64, 4, 3, None))
        assert _tiles(ring_dq) == (64, 64, 4, 3, None)
    finally:
        flash.attention_plans.cache_clear()


@pytest.mark.parametrize("splits", [None, 1, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_128_dkdv_tile(causal, splits, monkeypatch):
    """Head dim 128's dK/dV tile is 32x64/4w/3s at every length, mask, split
    (and while the split is sized) and for the ranged kernel: one of the
    candidates the GPU suite checks."""
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    for length in (1024, 4096, 16384):
        for ranged in (False, True):
            got = flash_configs.measured_choice("dkdv", 128, causal, length, length, ranged, splits)
            assert got == (32, 64, 4, 3), (length, ranged)
    assert (32, 64, 4, 3) in flash_configs.CONFIGS["dkdv"][128]


@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_128_ranged_tiles(causal, monkeypatch):
    """Head dim 128's ranged forward and dQ (segment ids, packed input)
    keep their short-length tiles at every length, where plain attention's
    take 128 query rows from 2k keys on; both are candidates the GPU suite
    checks."""
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    short = {"fwd": (64, 64, 4, 3), "dq": (64, 32, 4, 3)}
    long = {"fwd": (128, 64, 8, 3), "dq": (128, 64, 8, 2)}
    for kind, want in short.items():
        assert want in flash_configs.CONFIGS[kind][128]
        for length in (1024, 2048, 4096, 16384):
            got = flash_configs.measured_choice(kind, 128, causal, length, length, True)
            assert got == want, (kind, length)
            plain = flash_configs.measured_choice(kind, 128, causal, length, length, False)
            assert plain == (long[kind] if length >= 2048 else want), (kind, length)


@pytest.fixture
def gpu_segment_plans(monkeypatch):
    """``make(D) -> (q, plain, by_ids)``: the plans of B1 T4k, 8 query heads
    on 2, head dim ``D``, causal, bf16, with a GPU's configs (the
    interpreter's are one table entry for all) and the warp-specialised
    forward off, without and with segment ids (and their ranges)."""
    monkeypatch.setattr(flash_tma_plans, "WS_FORWARD", "off")
    monkeypatch.setattr(flash, "interpreter_requested", lambda: False)
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    flash.attention_plans.cache_clear()

    def make(D):
        q, kv = _info((1, 4096, 8, D), "bfloat16"), _info((1, 4096, 2, D), "bfloat16")
        ids = _info((1, 4096), "int32")
        plain, _ = flash.plans(q, kv, kv, causal=True)
        by_ids, _ = flash.plans(q, kv, kv, ids, causal=True, q_key_range=ids, kv_query_range=ids)
        return q, plain, by_ids

    yield make
    flash.attention_plans.cache_clear()


@pytest.mark.parametrize("D", [64, 128])
def test_ranged_forward_edge_stages(D, gpu_segment_plans):
    """The ranged kernels' masked runs pipeline over 2 stages where
    flash_configs.edge_stages measured it (head dim 128's forward, head dim
    64's dQ and dK/dV at the tiles a B1 T4k call takes), over the launch's
    own elsewhere (0); a gated pair's first launch keeps plain attention's
    0, so it is plain attention's kernel."""
    q, plain, by_ids = gpu_segment_plans(D)
    whole, rest = by_ids.forward
    assert plain.forward[0].constexprs["EDGE_STAGES"] == whole.constexprs["EDGE_STAGES"] == 0
    want = 2 if D == 128 else 0
    assert rest.constexprs["EDGE_STAGES"] == want and rest.constexprs["HAS_RANGE"]
    tiles = (rest.constexprs["BM"], rest.constexprs["BN"], rest.num_warps, rest.num_stages)
    assert flash_configs.edge_stages("fwd", flash_configs.dim_class(D), True, tiles) == want
    assert flash_configs.edge_stages("fwd", 128, False, (64, 64, 4, 3)) == 0
    # The backward's ranged launches: head dim 64's dQ and dK/dV take 2.
    dkdv, dq = by_ids.grads(q, q)
    for kind, steps in (("dkdv", dkdv), ("dq", dq)):
        rest = next(st for st in steps if st.constexprs.get("GATE") == 2)
        tiles = (rest.constexprs["BM"], rest.constexprs["BN"], rest.num_warps, rest.num_stages)
        got = rest.constexprs["EDGE_STAGES"]
        assert got == flash_configs.EDGE_STAGES.get((kind, flash_configs.dim_class(D), tiles), 0), kind
        assert got == (2 if D == 64 else 0), (kind, tiles)


@pytest.mark.parametrize("D", [64, 128])
def test_segment_ids_run_as_gated_pairs_of_plain_and_ranged_kernels(D, gpu_segment_plans):
    """With segment ids, each main launch is a gated pair (flash.gated_pair):
    first plain attention's own launch (same kernel, tiles and constexprs
    but GATE), then the ranged one writing into its outputs.  Checked with
    a GPU's configs (the interpreter's are one table entry for all), the
    warp-specialised forward off (on sm_90 plain attention takes it; the
    pair's first launch is the main kernel)."""
    q, plain, by_ids = gpu_segment_plans(D)
    pairs = {"fwd": (plain.forward, by_ids.forward)}
    grads = zip(plain.grads(q, q), by_ids.grads(q, q), strict=True)
    pairs.update(zip(("dkdv", "dq"), grads, strict=True))
    for kind, (alone, pair) in pairs.items():
        # dK/dV's split sum (B1 with 2 key heads splits its group)
        # follows both, the same launch.
        p, *after = alone
        whole, rest, *after_pair = pair
        assert after == after_pair and len(after) == (kind == "dkdv"), kind
        assert whole.kernel is p.kernel and (callable(p.grid) or whole.grid == p.grid), kind
        assert {**whole.constexprs, "GATE": 0} == p.constexprs and whole.constexprs["GATE"] == 1, kind
        assert (whole.num_warps, whole.num_stages, whole.maxnreg) == (
            p.num_warps,
            p.num_stages,
            p.maxnreg,
        )
        assert whole.aliases == () and whole.params[-len(p.outputs) :] == p.params[-len(p.outputs) :]
        assert rest.constexprs["GATE"] == 2 and rest.constexprs["HAS_SEG"] and rest.constexprs["HAS_RANGE"]
        assert rest.aliases == tuple(enumerate(p.output_names)), kind
        assert rest.params[-len(p.outputs) :] == tuple(In(n) for n in p.output_names), kind
        if D == 64:  # the ranged launch keeps its own measured tiles
            tiles = (rest.constexprs["BM"], rest.constexprs["BN"], rest.num_warps, rest.num_stages)
            splits = 4 if kind == "dkdv" else 1  # a group of 4 at 2 x 64 key blocks
            assert tiles == flash_configs.measured_choice(kind, 64, True, 4096, 4096, True, splits), kind
            block = tiles[1] if kind == "dkdv" else tiles[0]
            assert rest.grid[0] == 4096 // block, kind
    # Head dim 64's forward: the plain and ranged tiles differ.
    if D == 64:
        assert by_ids.forward[0].constexprs["BM"] != by_ids.forward[1].constexprs["BM"]


def _delta_plans(monkeypatch, settings, dtype="bfloat16", B=2, T=300, K=64, V=64, packed=False, **kw):
    """The chunk-mode plans of a per-channel-gate delta-rule call (HK 2, HV
    4) with chunk's module ``settings`` set for it."""
    from core_triton.delta_rule import chunk, gated_delta_rule

    for name, value in settings.items():
        monkeypatch.setattr(chunk, name, value)
    gated_delta_rule._make_plans.cache_clear()
    HK, HV = 2, 4
    x = {n: _info((B, T, HK, K), dtype) for n in ("query", "key")}
    x.update(value=_info((B, T, HV, V), dtype), beta=_info((B, T, HV), dtype), gk=_info((B, T, HV, K)))
    cu = _info((4,), "int32") if packed else None
    try:
        return gated_delta_rule.plans(**x, cu_seqlens=cu, mode="chunk", **kw)
    finally:
        gated_delta_rule._make_plans.cache_clear()


def _launch(launches, kernel):
    (p,) = [p for p in launches if p.kernel.__name__ == kernel]
    return p


@pytest.mark.parametrize("gate", ["g", "gk"])
@pytest.mark.parametrize("packed", [False, True])
def test_delta_rule_per_chunk_grids_hold_one_program_per_chunk_slot(gate, packed):
    # The per-chunk launches (grid axis "slot" then batch row x value head)
    # hold cdiv(T, 64) slots per batch row, plus N for packed input's
    # partial chunks: never B * cdiv(T, 64) per batch row, which left all
    # but one program in B idle.
    from core_triton.delta_rule import chunk, gated_delta_rule

    B, T, HK, HV, K, V = (1, 1000, 2, 4, 32, 16) if packed else (3, 1000, 2, 4, 32, 16)
    N = 5 if packed else B
    x = dict(
        query=_info((B, T, HK, K), "bfloat16"),
        key=_info((B, T, HK, K), "bfloat16"),
        value=_info((B, T, HV, V), "bfloat16"),
        beta=_info((B, T, HV), "bfloat16"),
    )
    x[gate] = _info((B, T, HV) if gate == "g" else (B, T, HV, K))
    cu = _info((N + 1,), "int32") if packed else None
    plans = gated_delta_rule.plans(**x, cu_seqlens=cu, mode="chunk")
    slots = cdiv(T, chunk.CHUNK) + (N if packed else 0)
    per_chunk = {
        "delta_chunk_diag_kernel": 0,
        "delta_chunk_intra_kernel": 0,
        "delta_chunk_fwd_wu_kernel": 0,
        "delta_chunk_fwd_output_kernel": 1,
        "delta_chunk_bwd_dv_kernel": 1,
        "delta_chunk_bwd_dqk_kernel": 1,
    }
    seen = set()
    for p in (*plans.forward, *plans.backward, *plans.inference):
        name = p.kernel.__name__ if hasattr(p.kernel, "__name__") else str(p.kernel)
        if name in per_chunk:
            axis = per_chunk[name]
            assert p.grid[axis] == slots and p.grid[axis + 1] == B * HV, (name, p.grid)
            seen.add(name)
    assert {"delta_chunk_intra_kernel", "delta_chunk_bwd_dv_kernel", "delta_chunk_bwd_dqk_kernel"} <= seen
    assert ("delta_chunk_diag_kernel" in seen) == (gate == "gk")


@pytest.mark.parametrize("l2", [True, False])
def test_delta_rule_walk_reads_float16_qd_only_for_normalised_half_inputs(l2, monkeypatch):
    # chunk.WALK_READS_QD: float16 holds q exp(b) only where |q| <= 1 (the
    # normalised queries); otherwise the walk forms it from q and gc.
    plans = _delta_plans(monkeypatch, {"WALK_READS_QD": True}, use_qk_l2norm=l2)
    # (the training forward keeps a bf16 Qd for the backward anyway: KEEP_WU)
    for launches, kept in ((plans.forward, True), (plans.inference, False)):
        walk = _launch(launches, "delta_chunk_fwd_walk_kernel")
        wu = _launch(launches, "delta_chunk_fwd_wu_kernel")
        qd = dict(zip(wu.output_names, wu.outputs, strict=True))["qd"]
        assert walk.constexprs["Q_DECAYED"] == l2
        assert (walk.params[0] == In("qd")) == l2
        if l2:
            assert (qd.dtype, qd.shape) == ("float16", (2, 300, 4, 64))
        else:
            assert qd.shape == ((2, 300, 4, 64) if kept else (1,)) and qd.dtype == "bfloat16"


@pytest.mark.parametrize("dtype,l2", [("bfloat16", True), ("bfloat16", False), ("float32", True)])
def test_delta_rule_scores_in_float16_only_for_normalised_half_inputs(dtype, l2, monkeypatch):
    # chunk.P_FLOAT16: |P| <= 1 needs normalised q and k; float32 inputs keep
    # float32 throughout.
    plans = _delta_plans(monkeypatch, {"P_FLOAT16": True}, dtype=dtype, use_qk_l2norm=l2)
    intra = _launch(plans.forward, "delta_chunk_intra_kernel")
    aqk = dict(zip(intra.output_names, intra.outputs, strict=True))["aqk"]
    assert aqk.dtype == ("float16" if l2 and dtype != "float32" else "float32")


def test_dkdv_group_split_rule():
    """dK/dV's query-head group is split only where one program a key block
    leaves fewer than DKDV_SPLIT_BELOW programs an SM, and then into the
    fewest shares that make DKDV_PROGRAMS_PER_SM (the H100's 132 SMs)."""
    rule = flash_configs.dkdv_splits
    # B1, 4 key heads, 8 query heads each: T4k at 64 keys a block, T16k, and
    # T4k at 128 keys a block (head dim 128's causal dK/dV tile): 8 shares.
    assert [rule(kb, 4, 8, 132) for kb in (64, 256, 32)] == [8, 8, 8]
    assert rule(64, 4, 4, 132) == 4  # the whole group when no share is enough
    assert rule(512, 4, 8, 132) == 1  # T32k: 2048 programs already
    assert rule(64, 8 * 8, 4, 132) == 1  # B8 with 8 key heads
    assert rule(64, 4, 1, 132) == 1  # no group to split
    assert rule(400, 2, 6, 132) == 6 and rule(528, 2, 6, 132) == 1  # 1056 programs: 8 an SM
    assert rule(400, 2, 16, 132) == 8 and rule(100, 2, 16, 132) == 16


def test_dkdv_split_bounds_rows_a_program_sums():
    """Past DKDV_ROWS_MAX query rows a program (group x query length) the
    group is split even where the grid is full, into the fewest shares that
    bring it under the bound: an accuracy rule (the float32 accumulation's
    error grows with the rows it sums)."""
    rule, most = flash_configs.dkdv_splits, flash_configs.DKDV_ROWS_MAX
    full = (4096, 4, 8, 132)  # far more programs than DKDV_SPLIT_BELOW an SM
    assert rule(*full, most // 8) == 1  # exactly at the bound
    assert rule(*full, most // 8 + 1) == 2
    assert rule(*full, most // 2) == 4 and rule(*full, 2 * most) == 8
    assert rule(*full, 100 * most) == 8  # the whole group is as far as it goes
    assert rule(4096, 4, 6, 132, most // 2) == 3  # a divisor: not 4 of a group of 6
    assert rule(4096, 4, 1, 132, 10 * most) == 1  # no group to split
    assert rule(64, 4, 8, 132, most // 4) == 8  # the occupancy rule asks more


def test_autotuning_is_kept_per_length_class(monkeypatch):
    """An autotuned flash kernel keeps its pick per length class (the longer
    side rounded up to a power of two, 1k to 64k): lengths of one class
    share the autotuner, another class gets its own, and every class runs
    the same kernel (so no recompile).  On a GPU with the measured tiles
    switched off (flash_configs.MEASURED), as the interpreter runs."""
    assert [flash_configs.length_class(n) for n in (1, 1024, 1025, 4096, 5000, 10**6)] == [
        1024, 1024, 2048, 4096, 8192, 65536,
    ]  # fmt: skip

    def kernels(Tq, Tk):
        q, kv = _info((1, Tq, 4, 64), "bfloat16"), _info((1, Tk, 2, 64), "bfloat16")
        p, _ = flash.plans(q, kv, kv, causal=True)
        (fwd,) = p.forward
        (dkdv, *_), (dq,) = p.grads(q, q)
        return fwd.kernel, dkdv.kernel, dq.kernel

    monkeypatch.setattr(flash_configs, "MEASURED", False)
    flash.replan()
    try:
        short, same = kernels(3000, 3000), kernels(4096, 2000)
        longer, cross = kernels(8000, 8000), kernels(1, 5000)
    finally:
        monkeypatch.undo()
        flash.replan()  # drop the plans made without the measured tiles
    assert all(callable(getattr(k, "run", None)) and hasattr(k, "configs") for k in short), "not autotuned"
    assert short == same and cross == longer
    assert all(a is not b and a.fn is b.fn for a, b in zip(short, longer, strict=True))


def test_stride_hint_bits_name_each_stride():
    """DIV16's bit ``i`` is the ``i``-th stride of flash_common.HINTED (the
    forward's and the backward's alike; the forward has no dO, only the dQ
    kernel reads the output), set where the stride is a multiple of 16 and
    not 0 or 1."""
    from core_triton.attention.flash_common import HINTED

    q = TensorInfo((2, 40, 4, 24), "bfloat16", (3840, 96, 24, 1))  # qh = 24: no
    k = TensorInfo((2, 40, 2, 24), "bfloat16", (1, 2, 80, 1280))  # kb = 1, kt = 2: no
    v = TensorInfo((2, 40, 2, 16), "bfloat16", (1288, 32, 16, 1))  # vb = 1288: no
    do = TensorInfo((2, 40, 4, 24), "bfloat16", (4004, 100, 25, 1))  # none
    want = {"qt", "qb", "kh", "vt", "vh"}
    bits = flash_configs.stride_hint_bits(q, k, v)
    assert {n for i, n in enumerate(HINTED) if bits >> i & 1} == want
    assert flash_configs.stride_hint_bits(q, k, v, do) == bits
    do = TensorInfo((2, 40, 4, 24), "bfloat16", (3840, 96, 24, 1))
    got = flash_configs.stride_hint_bits(q, k, v, do)
    assert {n for i, n in enumerate(HINTED) if got >> i & 1} == want | {"dot", "dob"}
    plans, _ = flash.plans(q, k, v, causal=True)
    assert plans.forward[0].constexprs["DIV16"] == bits
    dkdv, dq = plans.grads(do, do)  # the output laid out as dO
    assert dkdv[0].constexprs["DIV16"] == got
    with_out = flash_configs.stride_hint_bits(q, k, v, do, do)
    assert {n for i, n in enumerate(HINTED) if with_out >> i & 1} == want | {"dot", "dob", "ot", "ob"}
    assert dq[0].constexprs["DIV16"] == with_out
    o = TensorInfo((2, 40, 4, 24), "bfloat16", (3840, 24, 960, 1))  # oh = 960, ot = 24
    _, dq = plans.grads(do, o)
    named = {n for i, n in enumerate(HINTED) if dq[0].constexprs["DIV16"] >> i & 1}
    assert named == want | {"dot", "dob", "ob", "oh"}


def test_program_order_rule(monkeypatch):
    """The launch order (flash_common.block_and_row): causal attention
    without a window outside the ranged kernel, with 4 or more query heads a
    key head, starts its heaviest blocks first, heads on axis 0 (forward and
    dQ from the last query block, 2; dK/dV from the first key block, 1),
    with fewer keeps 0 (the warp-specialised forward 3); a window, no mask or the ranged
    kernel keep 0, and so does a launch whose grid would not fit the
    transposed grid (65535 programs on axis 1).  More (batch, head)
    programs than axis 1 takes: the transposed grid (1, or 2 where heavy
    blocks go first), whatever else holds.  A forced order
    (flash_configs.PROGRAM_ORDER) holds wherever the grid fits."""
    rule = flash_configs.program_order
    kinds = ("fwd", "dq", "dkdv")
    assert [rule(kind, True, False, False, 64, 32, 4) for kind in kinds] == [2, 2, 1]
    # Without shared key heads: 0, but 3 for the forward that flips its blocks.
    assert [rule(kind, True, False, False, 64, 32, 2) for kind in kinds] == [0, 0, 0]
    assert [rule(kind, True, False, False, 64, 32, 1, True) for kind in kinds] == [3, 0, 0]
    for causal, window, ranged in ((False, False, False), (True, True, False), (True, False, True)):
        for kind in kinds:
            assert rule(kind, causal, window, ranged, 64, 32, 8, True) == 0, (kind, causal, window, ranged)
    assert rule("fwd", True, False, False, 65535, 32, 8) == 2
    assert rule("fwd", True, False, False, 65536, 32, 8) == 0
    assert rule("fwd", True, False, False, 65536, 32, 8, True) == 3
    assert rule("dkdv", True, False, False, 64, 2**31, 8) == 0
    many = 65536  # (batch, head) programs past axis 1
    assert [rule(kind, True, False, False, 64, many, 8) for kind in kinds] == [2, 2, 1]
    assert [rule(kind, True, False, False, 64, many, 1, True) for kind in kinds] == [2, 2, 1]
    for causal, window, ranged in ((False, False, False), (True, True, False), (True, False, True)):
        assert [rule(kind, causal, window, ranged, 64, many, 8, True) for kind in kinds] == [1, 1, 1]
    assert flash_configs.program_grid(64, 32, 0) == flash_configs.program_grid(64, 32, 3) == (64, 32)
    assert flash_configs.program_grid(64, 32, 1) == flash_configs.program_grid(64, 32, 2) == (32, 64)
    for order in (0, 1, 2, 3):
        monkeypatch.setattr(flash_configs, "PROGRAM_ORDER", order)
        assert rule("dq", False, True, True, 64, 32) == order
        assert rule("fwd", True, False, False, 70000, 32) == (order if order in (0, 3) else 0)
        assert rule("dq", False, False, False, 64, many) == 1


def _orders(steps, rows, programs):
    """``(ORDER, grid)`` of each main launch of ``steps`` (a split's sum has
    no order), with an autotuned grid evaluated at 32x32 tiles; checks that
    the grid holds ``cdiv(rows, block)`` blocks on the order's axis."""
    out = []
    for p in steps:
        if "ORDER" not in p.constexprs:
            continue
        order = p.constexprs["ORDER"]
        meta = {"BM": 32, "BN": 32, **p.constexprs}
        grid = p.grid(meta) if callable(p.grid) else p.grid
        block = meta["BN"] if {"dk", "dk_part"} & set(p.output_names) else meta["BM"]
        assert grid == flash_configs.program_grid(cdiv(rows, block), programs, order), (p.output_names, grid)
        out.append(order)
    return out


@pytest.mark.parametrize("measured", [True, False])
def test_causal_plans_start_the_heaviest_blocks(measured, monkeypatch):
    """The plans' launch orders: causal without a window, forward and dQ 2,
    dK/dV 1 (its split too), with grids laid out to match, measured tiles
    or autotuned; not causal, or with a window, 0 everywhere; with segment
    ids, the gated pair's first launch (plain attention's kernel, the
    warp-specialised forward too) takes plain attention's order and the
    ranged one 0."""
    monkeypatch.setattr(flash, "interpreter_requested", lambda: False)
    monkeypatch.setattr(flash_configs, "interpreter_requested", lambda: False)
    monkeypatch.setattr(flash_configs, "MEASURED", measured)
    monkeypatch.setattr(flash_configs, "DKDV_SPLITS", 2)  # a split of the group of 4
    monkeypatch.setattr(flash_tma_plans, "WS_FORWARD", "off")
    flash.replan()  # plans and flash.plans' own cache
    try:
        B, T, HQ, H = 2, 4096, 8, 2
        q, kv = _info((B, T, HQ, 64), "bfloat16"), _info((B, T, H, 64), "bfloat16")
        ids = _info((B, T), "int32")
        by_ids = {"q_segment_ids": ids, "q_key_range": ids, "kv_query_range": ids}

        def orders(**options):
            plans, _ = flash.plans(q, kv, kv, **options)
            dkdv, dq = plans.grads(q, q)
            return (
                _orders(plans.forward, T, B * HQ),
                _orders(dq, T, B * HQ),
                _orders(dkdv, T, B * H * 2),
            )

        assert orders(causal=True) == ([2], [2], [1])
        assert orders() == ([0], [0], [0])
        assert orders(causal=True, sliding_window=128) == ([0], [0], [0])
        assert orders(causal=True, **by_ids) == ([2, 0], [2, 0], [1, 0])
        assert orders(**by_ids) == ([0, 0], [0, 0], [0, 0])
        # Past 65535 (batch, head) programs the grids are transposed.
        B = 8200
        q, kv = _info((B, T, HQ, 64), "bfloat16"), _info((B, T, H, 64), "bfloat16")
        assert orders(causal=True) == ([2], [2], [1])
        assert orders() == ([1], [1], [0])  # B * H * 2 dK/dV programs fit axis 1
        B = 2
        monkeypatch.setattr(flash_tma_plans, "WS_FORWARD", "on")
        for D in (64, 128):  # the warp-specialised forward at 128
            q, kv = _info((B, T, HQ, D), "bfloat16"), _info((B, T, H, D), "bfloat16")
            plans, _ = flash.plans(q, kv, kv, causal=True)
            assert (plans.forward[0].kernel is flash_tma_plans.flash_fwd_ws_kernel) == (D == 128)
            assert _orders(plans.forward, T, B * HQ) == [2]
            plans, _ = flash.plans(q, kv, kv, causal=True, **by_ids)
            assert _orders(plans.forward, T, B * HQ) == [2, 0]
    finally:
        flash.replan()


def _on_sm90(monkeypatch):
    """Plans as on an sm_90 GPU of 132 SMs, with the Gluon kernels (a
    stand-in object for each where this Triton has no Gluon)."""
    from core_triton.attention import (
        flash_bwd_dkdv_gluon,
        flash_bwd_dq_gluon,
        flash_bwd_plans,
        flash_fwd_gluon,
        flash_fwd_gluon_persistent,
    )

    for module in (flash, flash_configs, flash_tma_plans):
        monkeypatch.setattr(module, "interpreter_requested", lambda: False)
    monkeypatch.setattr(flash_tma_plans, "cuda_capability", lambda: 90)
    monkeypatch.setattr(flash_bwd_plans, "multiprocessor_count", lambda: 132)
    monkeypatch.setattr(flash_tma_plans, "multiprocessor_count", lambda: 132)
    monkeypatch.setattr(flash_tma_plans, "GLUON_PERSISTENT", True)
    for module, name in (
        (flash_fwd_gluon, "flash_fwd_gluon_kernel"),
        (flash_fwd_gluon_persistent, "flash_fwd_gluon_kernel"),
        (flash_bwd_dq_gluon, "flash_bwd_dq_gluon_kernel"),
        (flash_bwd_dkdv_gluon, "flash_bwd_dkdv_gluon_kernel"),
    ):
        if getattr(module, name) is None:
            monkeypatch.setattr(module, name, object())
    for name in ("GLUON_FORWARD", "GLUON_BACKWARD", "WS_FORWARD"):
        monkeypatch.setattr(flash_tma_plans, name, "auto")
    flash.replan()
    return flash_bwd_dq_gluon.flash_bwd_dq_gluon_kernel, flash_bwd_dkdv_gluon.flash_bwd_dkdv_gluon_kernel


def test_gluon_backward_where_it_applies(monkeypatch):
    """On an sm_90 GPU the plan takes the Gluon dQ for plain and causal
    half-precision attention at head dim 128 from 2048 queries and keys
    (not with an ``lse`` cotangent), and the Gluon dK/dV there too, but
    causal only from 4096 and never where the Triton dK/dV's plan splits the
    query-head group; the Triton kernels for anything else: shorter, head
    dim 64, a window, float32, sinks, a cotangent in another dtype or not
    row-major, Tq != Tk where the shorter side is short."""
    try:
        dq_g, dkdv_g = _on_sm90(monkeypatch)

        def picked(B, Tq, Tk, HQ, H, D, options=None, dlse=False, dtype="bfloat16", do=None, sink=False):
            q, kv = _info((B, Tq, HQ, D), dtype), _info((B, Tk, H, D), dtype)
            aux = _info((HQ,)) if sink else None
            plans = flash.plans(q, kv, kv, softmax_aux=aux, **(options or {}))[0]
            dkdv, dq = plans.grads(do or q, q, dlse)
            kernels = [p.kernel for p in dkdv + dq]
            return dq_g in kernels, dkdv_g in kernels

        causal = {"causal": True}
        assert picked(4, 8192, 8192, 16, 16, 128) == (True, True)
        assert picked(4, 8192, 8192, 16, 16, 128, causal) == (True, True)
        assert picked(4, 8192, 8192, 16, 16, 128, causal, dlse=True) == (False, True)
        assert picked(8, 4096, 4096, 16, 16, 128, causal) == (True, True)
        assert picked(16, 2048, 2048, 16, 16, 128) == (True, True)
        assert picked(16, 2048, 2048, 16, 16, 128, causal) == (True, False)
        assert picked(1, 4096, 4096, 32, 4, 128, causal) == (True, False)  # the Triton dK/dV splits
        assert picked(2, 8192, 8192, 32, 8, 128, causal) == (True, True)  # it does not
        assert picked(4, 8192, 2048, 16, 16, 128) == (True, True)
        assert picked(4, 8192, 1024, 16, 16, 128) == (False, False)
        assert picked(32, 1024, 1024, 16, 16, 128) == (False, False)
        assert picked(4, 8192, 8192, 16, 16, 64) == (False, False)
        assert picked(4, 8192, 8192, 16, 16, 128, {"sliding_window": 256}) == (False, False)
        assert picked(4, 8192, 8192, 16, 16, 128, dtype="float32") == (False, False)
        assert picked(4, 8192, 8192, 16, 16, 128, sink=True) == (False, False)
        assert picked(4, 8192, 8192, 16, 16, 128, dtype="float16") == (True, True)
        other = _info((4, 8192, 16, 128), "float16")
        assert picked(4, 8192, 8192, 16, 16, 128, do=other) == (False, False)
        strided = TensorInfo((4, 8192, 16, 128), "bfloat16", (8192 * 16 * 128, 128, 8192 * 128, 1))
        assert picked(4, 8192, 8192, 16, 16, 128, do=strided) == (False, False)
        # (batch, head) programs past the grid's second axis: Triton's transposed grids.
        assert picked(4200, 2048, 2048, 16, 16, 128) == (False, False)
        monkeypatch.setattr(flash_tma_plans, "GLUON_BACKWARD", "off")
        flash.replan()
        assert picked(4, 8192, 8192, 16, 16, 128) == (False, False)
        monkeypatch.setattr(flash_tma_plans, "GLUON_BACKWARD", "on")
        flash.replan()
        assert picked(1, 128, 128, 32, 4, 128, causal) == (True, True)  # every length, unsplit
    finally:
        flash.replan()


def test_gluon_forward_persistent(monkeypatch):
    """On an sm_90 GPU the Gluon forward of plain attention (head dims 128
    and 64, half precision, from 1024 tokens) is the persistent kernel, one
    program an SM (132) or a tile where there are fewer, two Q buffers and
    two stages, two consumer groups of 64 rows (three, a tile of 192 rows
    under maxnreg 128, at head dim 64 without a mask from 2048 tokens on);
    with segment ids it is a gated pair's first launch (GATE
    1), and with flash.set_gluon_ranged(True) it takes the call alone
    (``RANGED``: the queries' ranges and both sides' ids and batch strides
    as parameters); flash.set_gluon_persistent(False) brings back the
    kernel of one program a tile at head dim 128 (a pair's first launch),
    and flash_fwd_kernel at 64 (no Gluon there)."""
    from core_triton.attention import flash_fwd_gluon, flash_fwd_gluon_persistent

    try:
        _on_sm90(monkeypatch)
        persistent = flash_fwd_gluon_persistent.flash_fwd_gluon_kernel
        tiled = flash_fwd_gluon.flash_fwd_gluon_kernel

        def forward(B, T, HQ, H, options=None, ids=False, D=128):
            q, kv = _info((B, T, HQ, D), "bfloat16"), _info((B, T, H, D), "bfloat16")
            extra = {}
            if ids:
                rng = _info((B, 2 * T), "int32")
                extra = {"q_segment_ids": _info((B, T), "int32"), "q_key_range": rng, "kv_query_range": rng}
                extra["kv_segment_ids"] = _info((B, T), "int64")
            return flash.plans(q, kv, kv, **extra, **(options or {}))[0].forward

        for D, options in itertools.product((128, 64), ({}, {"causal": True})):
            (plan,) = forward(16, 2048, 16, 16, options, D=D)
            assert plan.kernel is persistent and plan.grid == (132,), plan
            c = plan.constexprs
            groups = 3 if (D, options) == (64, {}) else 2
            got = (c["GATE"], c["STAGES"], c["QBUFS"], c["BM"], c["BN"], c["D"], c["GROUPS"])
            assert got == (0, 2, 2, 64 * groups, 128, D, groups), c
            assert c["CAUSAL"] == bool(options) and plan.maxnreg == (128 if groups == 3 else 168), plan
            (short,) = forward(16, 2047, 16, 16, options, D=D)
            assert (short.constexprs["GROUPS"], short.constexprs["BM"], short.maxnreg) == (2, 128, 168), short
            flash.set_gluon_ranged(True)
            (alone,) = forward(4, 8192, 16, 16, options, ids=True, D=D)
            flash.set_gluon_ranged(False)
            assert alone.kernel is persistent and alone.grid == (132,), alone
            assert (alone.constexprs["GATE"], alone.constexprs["RANGED"]) == (0, True), alone
            names = [getattr(p, "name", p) for p in alone.params[:8]]
            want = ["q", "k", "v", "q_key_range", "q_segment_ids", "kv_segment_ids", 8192, 8192]
            assert names == want, names
            assert "RANGED" not in plan.constexprs and plan.params[4].name == "q", plan
            first, rest = forward(4, 8192, 16, 16, options, ids=True, D=D)
            assert first.kernel is persistent and first.grid == (132,), first
            assert first.constexprs["GATE"] == 1 and "RANGED" not in first.constexprs, first
            assert (first.constexprs["GROUPS"], alone.constexprs["GROUPS"]) == (2, 2), (first, alone)
            assert first.params[3].name == "q_key_range" and rest.constexprs["GATE"] == 2, (first, rest)
        (plan,) = forward(1, 1024, 1, 1)  # 8 tiles: 8 programs
        assert plan.kernel is persistent and plan.grid == (8,), plan
        # Three groups: tiles of 192 rows (11 at T2048), float16 too; the
        # shorter side decides (keys 1024: two groups).
        (plan,) = forward(1, 2048, 1, 1, D=64)
        assert (plan.grid, plan.constexprs["GROUPS"]) == ((11,), 3), plan
        q16, kv16 = _info((1, 2048, 2, 64), "float16"), _info((1, 2048, 2, 64), "float16")
        assert flash.plans(q16, kv16, kv16)[0].forward[0].constexprs["GROUPS"] == 3
        kv_short = _info((1, 1024, 2, 64), "bfloat16")
        (cross,) = flash.plans(_info((1, 8192, 2, 64), "bfloat16"), kv_short, kv_short)[0].forward
        assert cross.kernel is persistent and cross.constexprs["GROUPS"] == 2, cross
        # Its grid has one axis: (batch, head) rows past CUDA's 65535 on a
        # second axis still take it (the kernel of a program a tile not).
        (plan,) = forward(4200, 1024, 16, 16)
        assert plan.kernel is persistent and plan.grid == (132,), plan
        flash.set_gluon_persistent(False)
        (plan,) = forward(16, 2048, 16, 16)
        assert plan.kernel is tiled and plan.grid == (16, 256) and "QBUFS" not in plan.constexprs, plan
        first, rest = forward(4, 8192, 16, 16, {"causal": True}, ids=True)
        assert first.kernel is tiled and first.constexprs["GATE"] == 1 and first.grid == (64, 64), first
        (plan,) = forward(4200, 1024, 16, 16)
        assert plan.kernel not in (tiled, persistent), plan
        (plan,) = forward(16, 2048, 16, 16, D=64)
        assert plan.kernel not in (tiled, persistent), plan
        with pytest.raises(TypeError, match="on must be a bool"):
            flash.set_gluon_persistent(1)
        with pytest.raises(TypeError, match="on must be a bool"):
            flash.set_gluon_ranged("yes")
    finally:
        flash.set_gluon_persistent(True)
        flash.set_gluon_ranged(False)
        flash.replan()


def test_gluon_backward_gated_pairs(monkeypatch):
    """With segment ids (their ranges given) the Gluon dQ and dK/dV are the
    first launches of the gated pairs where plain attention would take
    them (GATE 1, reading ``q_key_range`` and ``kv_query_range``), the
    ranged Triton kernels the second (GATE 2, writing the same outputs);
    the Triton pairs where the Triton dK/dV splits its group (even with
    the switch "on"), with an ``lse`` cotangent (dQ), and below 2048."""
    try:
        dq_g, dkdv_g = _on_sm90(monkeypatch)

        def pairs(B, T, HQ, H, options=None, dlse=False):
            q, kv = _info((B, T, HQ, 128), "bfloat16"), _info((B, T, H, 128), "bfloat16")
            ids, rng = _info((B, T), "int32"), _info((B, 2 * T), "int32")
            plans = flash.plans(q, kv, kv, ids, q_key_range=rng, kv_query_range=rng, **(options or {}))[0]
            dkdv, dq = plans.grads(q, q, dlse)
            return dkdv, dq

        for options in ({}, {"causal": True}):
            dkdv, dq = pairs(4, 8192, 16, 16, options)
            for steps, kernel, gate_range in ((dq, dq_g, "q_key_range"), (dkdv, dkdv_g, "kv_query_range")):
                first, rest = steps
                assert first.kernel is kernel and first.constexprs["GATE"] == 1, first
                assert In(gate_range) in first.params, first.params
                assert rest.kernel is not kernel and rest.constexprs["GATE"] == 2, rest
                assert rest.output_names == first.output_names and rest.aliases, rest
        dkdv, dq = pairs(4, 8192, 16, 16, dlse=True)
        assert dq[0].kernel is not dq_g and dkdv[0].kernel is dkdv_g
        dkdv, dq = pairs(1, 4096, 32, 4, {"causal": True})  # the Triton dK/dV splits
        assert dq[0].kernel is dq_g and dkdv_g not in [p.kernel for p in dkdv]
        dkdv, dq = pairs(4, 1024, 16, 16)
        assert dq_g not in [p.kernel for p in dq] and dkdv_g not in [p.kernel for p in dkdv]
        monkeypatch.setattr(flash_tma_plans, "GLUON_BACKWARD", "on")
        flash.replan()
        dkdv, dq = pairs(1, 128, 32, 4, {"causal": True})  # forced on, but the pair's split stays
        assert dq[0].kernel is dq_g and dkdv_g not in [p.kernel for p in dkdv]
        dkdv, dq = pairs(1, 128, 4, 4)
        assert dq[0].kernel is dq_g and dkdv[0].kernel is dkdv_g
    finally:
        flash.replan()
