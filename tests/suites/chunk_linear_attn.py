"""The chunk-parallel linear-attention tests, written once; each framework's
test module subclasses them with its adapter (``fw``).  Inputs and checks
are the recurrent suite's (``make_case``, ``check_case``: float64 reference
of the recurrence in docs/api.md, every gradient, nonzero final-state cotangent).

Shapes are small (the CPU interpreter is slow) but exercise every path:
several chunks with a partial last one, packed sequences that start
mid-chunk with an empty one among them, grouped queries (HQ = 2H), head dims
that are not powers of two (padded, masked tiles), several K/V tiles."""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest

from core_triton.linear_attn.naive import lightning_g_gamma
from tests.reference import assert_close
from tests.suites.kernel_level import KernelLevelCases
from tests.suites.recurrent import check_case, make_case

# Lengths 17 (two chunks of 16, the second of one token), 0, 33, 11; T = 61.
CU_SEQLENS = [0, 17, 17, 50, 61]
GATE_SETS = [(), ("g",), ("g_gamma",), ("g", "g_gamma")]
MATRIX = list(itertools.product(GATE_SETS, [False, True], [False, True]))
SMALL = dict(B=2, T=40, HQ=4, H=2, K=20, V=12, cu=CU_SEQLENS)
# What a binding whose kernel_cases is False runs of MATRIX: each gate set
# once, reverse and packed each both ways.
_BINDING_COMBOS = [(False, False), (True, True), (False, True), (True, False)]
BINDING_MATRIX = [(gates, *combo) for gates, combo in zip(GATE_SETS, _BINDING_COMBOS, strict=True)]


# The split state passes (core_triton/linear_attn/state_split.py), forced
# on: one chunk per segment, and two (SMALL's packed sequences of 2, 0, 3
# and 1 chunks then have segments shorter than, as long as and longer than
# the sequence; its batched rows of 3 chunks 3 or 2 segments).  Every
# gate set / direction / layout once, the segment length alternating so
# that each gate set and each layout meets both; the PyTorch session runs
# SPLIT_MATRIX, a binding whose kernel_cases is False SPLIT_BINDING_MATRIX.
SPLIT_MATRIX = [(*case, 1 + (i + i // 2) % 2) for i, case in enumerate(MATRIX)]
SPLIT_BINDING_MATRIX = [(("g", "g_gamma"), True, True, 1), (("g",), False, False, 1)]


@contextlib.contextmanager
def state_split(fw, segment_chunks, fused_output=True, gradient_walks=None):
    """Plan chunk_linear_attn (and lightning) with the state passes split
    into segments of ``segment_chunks`` chunks (0: never split);
    ``fused_output`` False: the split forward that stores the chunk states
    (where the segment output pass's tiles do not fit); ``gradient_walks``:
    state_split.GRADIENT_WALKS (None: as it is)."""
    from core_triton.linear_attn.state_split import forced_segments

    with forced_segments(segment_chunks, fused_output, gradient_walks=gradient_walks):
        fw.clear_caches()
        try:
            yield
        finally:
            fw.clear_caches()


@contextlib.contextmanager
def forward_only_segments(fw, segments):
    """Plan the chunk ops' forward for calls no gradient follows with
    segments of ``segments`` (state_split.FORWARD_ONLY_SEGMENTS); plans
    made before and inside are dropped."""
    from core_triton.linear_attn import chunk, state_split

    before = state_split.FORWARD_ONLY_SEGMENTS
    state_split.FORWARD_ONLY_SEGMENTS = tuple(segments)
    chunk._make_plans.cache_clear()
    fw.clear_caches()
    try:
        yield
    finally:
        state_split.FORWARD_ONLY_SEGMENTS = before
        chunk._make_plans.cache_clear()
        fw.clear_caches()


@contextlib.contextmanager
def launched_kernels(fw):
    """The kernels the binding's op runner launches inside the block (a
    list, filled as they launch; JAX: as they are traced)."""
    import importlib

    runner = importlib.import_module(f"{fw.name}_api._op")
    launch, kernels = runner.launch, []

    def spy(step, env):
        kernels.append(step.kernel)
        return launch(step, env)

    runner.launch = spy
    try:
        yield kernels
    finally:
        runner.launch = launch


def inference_segments(plans) -> list:
    """S of the forward-alone pass from zero of ``plans`` (its last
    parameter), one entry per such launch."""
    from core_triton.linear_attn.chunk_fwd_state import chunk_fwd_state_segment_kernel

    return [p.params[-1] for p in plans.inference if p.kernel is chunk_fwd_state_segment_kernel]


def is_split(plans, fused_output=True) -> bool:
    """Whether ``plans`` (an OpPlans) run the split state passes, forward
    and backward, with the forward's output from the segments' start
    states (``fused_output``) or from stored chunk states."""
    from core_triton.linear_attn.chunk_fwd_output import chunk_fwd_output_segment_kernel
    from core_triton.linear_attn.state_split import state_split_carry_kernel

    def runs(steps, kernel):
        return any(p.kernel is kernel for p in steps)

    fused = runs(plans.forward, chunk_fwd_output_segment_kernel)
    carries = runs(plans.forward, state_split_carry_kernel) and runs(plans.backward, state_split_carry_kernel)
    return carries and fused == fused_output


def gradient_walks_planned(kernels) -> bool:
    """Whether the launched ``kernels`` (a training call's, launched_kernels)
    are the split forward and the backward's gradient walks: the segment
    output pass four times (the output, dq, dv, dk) and neither chunk_dv
    nor chunk_dqk."""
    from core_triton.linear_attn.chunk_bwd_dqk import chunk_bwd_dqk_kernel
    from core_triton.linear_attn.chunk_bwd_dv import chunk_bwd_dv_kernel
    from core_triton.linear_attn.chunk_fwd_output import chunk_fwd_output_segment_kernel

    stored = chunk_bwd_dqk_kernel in kernels or chunk_bwd_dv_kernel in kernels
    return kernels.count(chunk_fwd_output_segment_kernel) == 4 and not stored


def check_lightning_walks(fw, *, reverse, layer_idx, num_layers, dtype="float32", seed, **shapes):
    """lightning_attn on ``make_case`` inputs of ``shapes`` (an initial
    state, one query head a state head) against the float64 reference,
    every gradient, asserting that the training call took the gradient
    walks (gradient_walks_planned)."""
    x, cu, cots = make_case(fw, h0=True, seed=seed, **shapes)
    g_gamma = lightning_g_gamma(shapes["H"], layer_idx, num_layers)

    def fn(**kw):
        return fw.api.lightning_attn(**kw, layer_idx=layer_idx, num_layers=num_layers, reverse=reverse)

    with launched_kernels(fw) as kernels:
        check_case(fw, fn, x, cu, cots, dtype=dtype, reverse=reverse, ref_extra={"g_gamma": g_gamma})
    assert gradient_walks_planned(kernels), "the training call did not take the gradient walks"


def chunk_plans(x, cu, reverse, chunk_size=16, dtype="float32"):
    """The plans chunk_linear_attn makes for ``make_case`` inputs, with
    query, key and value in ``dtype``."""
    from core_triton.common.launch import TensorInfo
    from core_triton.common.utils import contiguous_strides
    from core_triton.linear_attn import chunk

    def info(a, dtype="float32"):
        a = np.asarray(a)
        return TensorInfo(a.shape, dtype, contiguous_strides(a.shape))

    named = {n: info(a, dtype if n in ("query", "key", "value") else "float32") for n, a in x.items()}
    return chunk.plans(
        named["query"], named["key"], named["value"], named.get("g"), named.get("g_gamma"),
        None, named.get("initial_state"), reverse, info(cu, "int32") if cu else None, chunk_size,
    )  # fmt: skip


def _ids(case):
    gates, reverse, packed = case
    return "-".join(
        ["+".join(gates) or "nogate", "rev" if reverse else "fwd", "packed" if packed else "batched"]
    )


class ChunkLinearAttnSuite(KernelLevelCases):
    fw = None  # set by the framework's module

    def _fn(self, scale=None, reverse=False, chunk_size=16):
        api = self.fw.api

        def fn(**kw):
            return api.chunk_linear_attn(**kw, softmax_scale=scale, reverse=reverse, chunk_size=chunk_size)

        return fn

    @pytest.mark.parametrize("case", MATRIX, ids=_ids)
    def test_matches_reference(self, case):
        self._kernel_level(tuple(case) in BINDING_MATRIX)
        gates, reverse, packed = case
        x, cu, cots = make_case(self.fw, gates=gates, packed=packed, h0=True, **SMALL)
        check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, reverse=reverse)

    @pytest.mark.parametrize("reverse", [False, True])
    def test_default_chunk_size_without_initial_state(self, reverse):
        # chunk_size 64: one chunk per sequence but the longest; no h0.
        x, cu, cots = make_case(
            self.fw, gates=("g", "g_gamma"), packed=True, h0=False, HQ=2, H=1, K=8, V=16,
            cu=[0, 70, 70, 75], seed=1,
        )  # fmt: skip
        check_case(self.fw, self._fn(reverse=reverse, chunk_size=64), x, cu, cots, reverse=reverse)

    def test_scale_and_one_query_head_per_state(self):
        x, cu, cots = make_case(self.fw, gates=("g",), HQ=3, H=3, K=7, V=3, T=35, h0=True, seed=2)
        check_case(self.fw, self._fn(scale=0.3, chunk_size=32), x, cu, cots, scale=0.3)

    @pytest.mark.parametrize("reverse", [False, True])
    def test_large_odd_head_dims(self, reverse):
        # K = 100, V = 80: several K and V tiles of the first (interpreter)
        # configs, masked tails.
        x, cu, cots = make_case(
            self.fw, gates=("g", "g_gamma"), B=1, T=21, HQ=2, H=1, K=100, V=80, h0=True, seed=3
        )
        check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, reverse=reverse)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    def test_half_precision(self, dtype):
        x, cu, cots = make_case(self.fw, gates=("g", "g_gamma"), packed=True, h0=True, seed=4, **SMALL)
        check_case(self.fw, self._fn(reverse=dtype == "float16"), x, cu, cots, dtype=dtype,
                   reverse=dtype == "float16")  # fmt: skip

    def test_empty_sequences(self):
        # Sequences of length 0 pass the initial state through unchanged,
        # and their gradient through to it.
        x, cu, cots = make_case(
            self.fw, gates=("g",), packed=True, h0=True, K=5, V=4, cu=[0, 0, 19, 19], seed=5
        )
        check_case(self.fw, self._fn(), x, cu, cots)

    def test_matches_recurrent(self):
        api = self.fw.api
        if not hasattr(api, "recurrent"):
            pytest.skip("recurrent not available")
        fw = self.fw
        x, cu, _ = make_case(fw, gates=("g", "g_gamma"), packed=True, h0=True, seed=6, **SMALL)
        arrays = {n: fw.array(a) for n, a in x.items()}
        cu_arr = fw.array(cu, "int32")
        for reverse in (False, True):
            o1, h1 = api.chunk_linear_attn(**arrays, reverse=reverse, cu_seqlens=cu_arr, chunk_size=16)
            o2, h2 = api.recurrent(**arrays, reverse=reverse, cu_seqlens=cu_arr)
            assert_close(fw.numpy(o1), fw.numpy(o2), "float32", "output")
            assert_close(fw.numpy(h1), fw.numpy(h2), "float32", "final_state")

    # ---- state passes split over the sequence ------------------------------

    @pytest.mark.parametrize("case", SPLIT_MATRIX, ids=lambda c: f"{_ids(c[:3])}-seg{c[3]}")
    def test_split_state_passes(self, case):
        *case3, size = case
        gates, reverse, packed = case3
        self._kernel_level(tuple(case) in SPLIT_BINDING_MATRIX)
        x, cu, cots = make_case(self.fw, gates=gates, packed=packed, h0=True, **SMALL)
        with state_split(self.fw, size):
            assert is_split(chunk_plans(x, cu, reverse)), "the split path was not planned"
            check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, reverse=reverse)

    def test_split_state_passes_with_several_tiles(self):
        # K = 100, V = 80: several K x V tiles a segment pass walks (the
        # flattened tile index of its grid), masked tails.
        self._kernel_level()
        x, cu, cots = make_case(
            self.fw, gates=("g", "g_gamma"), B=1, T=37, HQ=2, H=1, K=100, V=80, h0=True, seed=15
        )
        with state_split(self.fw, 1):
            check_case(self.fw, self._fn(reverse=True), x, cu, cots, reverse=True)

    @pytest.mark.parametrize("packed", [False, True])
    def test_split_forward_storing_chunk_states(self, packed):
        # The split forward that stores every chunk's state for the output
        # kernel (where the segment output pass's whole-K tiles fit in no
        # shared memory: float32 at K = 256 on the H100).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gates=("g", "g_gamma"), packed=packed, h0=True, seed=16, **SMALL)
        with state_split(self.fw, 2, fused_output=False):
            assert is_split(chunk_plans(x, cu, False), fused_output=False)
            check_case(self.fw, self._fn(), x, cu, cots)

    def test_split_state_passes_without_initial_state(self):
        # No h0: the carry starts from zero; an empty sequence and one of a
        # single token among them.
        x, cu, cots = make_case(
            self.fw, gates=("g",), packed=True, h0=False, K=5, V=4, cu=[0, 0, 19, 20, 53], seed=13
        )
        with state_split(self.fw, 1):
            check_case(self.fw, self._fn(), x, cu, cots)

    @pytest.mark.parametrize(
        "packed,reverse,walks", [(True, False, True), (False, True, True), (True, True, False)]
    )
    def test_split_gradient_walks_without_gates(self, packed, reverse, walks):
        # No gate, one query head per state head: a split training call
        # takes the gradient walks (chunk.py) unless they are switched off;
        # the same inputs either way, and the walks' launches checked.
        # Segments of two chunks: a walk carries its state over a chunk.
        self._kernel_level((packed, reverse, walks) == (True, False, True))
        shapes = {**SMALL, "HQ": 2, "H": 2}
        x, cu, cots = make_case(self.fw, packed=packed, h0=True, seed=24, **shapes)
        with state_split(self.fw, 2, gradient_walks=walks):
            with launched_kernels(self.fw) as kernels:
                check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, reverse=reverse)
        assert gradient_walks_planned(kernels) == walks

    def test_gradient_walks_only_where_they_apply(self):
        # A gate that gets a gradient (g, or g_gamma of chunk_linear_attn)
        # or grouped queries keep the backward that stores the chunk states.
        from core_triton.linear_attn.chunk_bwd_dqk import chunk_bwd_dqk_kernel

        def stores(gates, HQ):
            x, cu, _ = make_case(self.fw, gates=gates, packed=True, h0=True, **{**SMALL, "HQ": HQ})
            with state_split(self.fw, 1):
                plans = chunk_plans(x, cu, False)
            return any(p.kernel is chunk_bwd_dqk_kernel for p in plans.backward)

        assert not stores((), 2)
        assert stores((), 4)
        assert stores(("g",), 2)
        assert stores(("g_gamma",), 2)

    @pytest.mark.parametrize("packed,reverse", [(False, False), (False, True), (True, False), (True, True)])
    @pytest.mark.parametrize("gates,dtype", [(("g",), "float32"), (("g_gamma",), "bfloat16")])
    def test_forward_only_split(self, packed, reverse, gates, dtype):
        # A call no gradient follows (PyTorch: no input requiring grad; JAX:
        # the primal) runs OpPlans.inference: here split into segments of one
        # chunk, from the segments' start states, while a training call keeps
        # the whole walk (segment_chunks's choice at this size); with float32
        # chunk states (a per-token gate) and half-precision ones (g_gamma,
        # bf16: lightning's).  Packed: 0, 45 and 52 tokens, 7 chunk slots (2
        # on average: one segment's worth of FORWARD_ONLY_SEGMENTS = (1,)),
        # the second sequence starting mid-chunk.  Its output pass carries
        # the segments itself (the empty sequence's final state is h0), in
        # both directions.
        from core_triton.linear_attn.chunk_fwd_output import chunk_fwd_output_segment_kernel
        from core_triton.linear_attn.state_split import state_split_carry_kernel

        shapes = {**SMALL, "cu": [0, 0, 45, 97]}
        x, cu, cots = make_case(self.fw, gates=gates, packed=packed, h0=True, seed=17, **shapes)
        with forward_only_segments(self.fw, (1,)):
            plans = chunk_plans(x, cu, reverse, dtype=dtype)
            assert not is_split(plans), "a training call at this size walks whole sequences"
            assert any(p.kernel is chunk_fwd_output_segment_kernel for p in plans.inference)
            assert state_split_carry_kernel not in [p.kernel for p in plans.inference]
            # The pass from zero leaves each sequence's last segment visited
            # to the output pass (its delta is never read); with a per-token
            # gate both read g itself (no cumsum launch, no gc).
            skips = [p.constexprs["SKIP_LAST"] for p in plans.inference if "SKIP_LAST" in p.constexprs]
            assert skips == [True]
            raw = [p.constexprs["G_RAW"] for p in plans.inference if "G_RAW" in p.constexprs]
            assert raw == [gates == ("g",)] * 2
            if gates == ("g",):
                assert not [p for p in plans.inference if "gc" in (*p.input_names(), *p.output_names)]
            fn = self._fn(reverse=reverse)
            with launched_kernels(self.fw) as kernels:
                check_case(self.fw, fn, x, cu, cots, dtype=dtype, grads=False, reverse=reverse)
            assert chunk_fwd_output_segment_kernel in kernels, "the forward-only call ran the training plan"
            with launched_kernels(self.fw) as kernels:
                check_case(self.fw, fn, x, cu, cots, dtype=dtype, reverse=reverse)
            assert chunk_fwd_output_segment_kernel not in kernels, "a training call ran the split forward"

    @pytest.mark.parametrize("packed,reverse", [(False, False), (True, True)])
    def test_forward_only_long_segments(self, packed, reverse, monkeypatch):
        # Where its output pass keeps a wave of programs, a forward no
        # gradient follows at one sequence (batch 1, or packed input of one)
        # takes the longer segments of state_split.LONG_SEGMENTS: here of 2
        # chunks (any program count makes a wave, any K qualifies), against
        # 1 from FORWARD_ONLY_SEGMENTS.
        from core_triton.linear_attn import state_split

        monkeypatch.setattr(state_split, "LONG_SEGMENTS", (2,))
        monkeypatch.setattr(state_split, "WAVE_FILL", 0.0)
        monkeypatch.setattr(state_split, "LONG_SEGMENTS_MIN_K", 0)
        shapes = {**SMALL, "B": 1, "T": 190, "cu": [0, 190]}  # 12 chunks
        x, cu, cots = make_case(self.fw, gates=("g",), packed=packed, h0=True, seed=23, **shapes)
        with forward_only_segments(self.fw, (1,)):
            plans = chunk_plans(x, cu, reverse)
            assert inference_segments(plans) == [2]
            check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, grads=False, reverse=reverse)

    # ---- bad input -------------------------------------------------------

    def _inputs(self, **shapes):
        fw = self.fw
        rng = np.random.default_rng(9)
        base = {"query": (2, 5, 4, 3), "key": (2, 5, 2, 3), "value": (2, 5, 2, 4)}
        base.update(shapes)
        return {n: fw.array(rng.standard_normal(s)) for n, s in base.items() if s is not None}

    def test_bad_chunk_size(self):
        x = self._inputs()
        for bad, err in [(8, ValueError), (48, ValueError), (0, ValueError), (512, ValueError),
                         (16.0, TypeError), (True, TypeError)]:  # fmt: skip
            with pytest.raises(err, match="chunk_size"):
                self.fw.api.chunk_linear_attn(**x, chunk_size=bad)

    def test_bad_shapes(self):
        cases = [
            ({"query": (2, 5, 4)}, "query"),
            ({"key": (2, 6, 2, 3)}, "seq_len"),
            ({"query": (2, 5, 3, 3)}, "multiple"),
            ({"query": (2, 5, 4, 300), "key": (2, 5, 2, 300)}, "head_dim"),
            ({"g": (2, 5, 3)}, "g must be"),
            ({"g_gamma": (2, 5, 2)}, "g_gamma"),
            ({"initial_state": (2, 2, 4, 3)}, "initial_state"),
        ]
        for shapes, match in cases:
            with pytest.raises(ValueError, match=match):
                self.fw.api.chunk_linear_attn(**self._inputs(**shapes))

    def test_bad_types_and_options(self):
        fw, api = self.fw, self.fw.api
        x = self._inputs()
        with pytest.raises(TypeError, match="dtype"):
            api.chunk_linear_attn(x["query"], x["key"], fw.array(np.zeros((2, 5, 2, 4)), "bfloat16"))
        with pytest.raises(TypeError, match="g"):
            api.chunk_linear_attn(**x, g=fw.array(np.zeros((2, 5, 2)), "int32"))
        with pytest.raises(TypeError, match="reverse"):
            api.chunk_linear_attn(**x, reverse=1)
        with pytest.raises(ValueError, match="softmax_scale"):
            api.chunk_linear_attn(**x, softmax_scale=float("nan"))
        with pytest.raises(ValueError, match="batch"):
            api.chunk_linear_attn(**x, cu_seqlens=fw.array([0, 2, 5], "int32"))
        with pytest.raises(TypeError):
            api.chunk_linear_attn(**x, gk=x["key"])  # vector gates are recurrent's
        one = self._inputs(query=(1, 5, 4, 3), key=(1, 5, 2, 3), value=(1, 5, 2, 4))
        # Values are checked on request only (the op never reads them on
        # the host); tests/packed_bounds.py checks what the op does with them.
        for values in ([0, 2, 4], [1, 2, 5], [0, 3, 2, 5]):
            with pytest.raises(ValueError, match="cu_seqlens"):
                api.check_cu_seqlens(fw.array(values, "int32"), one["query"].shape[1])


# Tests that take tens of GB of GPU memory carry this mark: gpu_run.sh runs
# them after the rest, one after another (-m xdist_group).
@pytest.mark.xdist_group("gpu_memory")
class ChunkLinearAttnGpuSuite:
    """Sizes only a GPU runs: 64-bit offsets (T = 65536, tensors past 2**31
    elements) and the default chunk size at realistic head dims."""

    fw = None

    def _skip_unless_gpu(self):
        from core_triton.common.runtime import interpreter_requested

        if interpreter_requested():
            pytest.skip("GPU-only sizes")

    def test_realistic_shape_against_reference(self):
        self._skip_unless_gpu()
        for dtype in ("float32", "bfloat16"):
            for reverse in (False, True):
                x, cu, cots = make_case(
                    self.fw, gates=("g", "g_gamma"), packed=True, h0=True, HQ=4, H=2, K=128, V=100,
                    cu=[0, 100, 100, 300], seed=7,
                )  # fmt: skip
                check_case(self.fw, self._fn(reverse), x, cu, cots, dtype=dtype, reverse=reverse)

    def _fn(self, reverse):
        api = self.fw.api
        return lambda **kw: api.chunk_linear_attn(**kw, reverse=reverse)

    @pytest.mark.parametrize(
        "packed,dtype,reverse,gates",
        [
            (True, "float32", False, ("g", "g_gamma")),
            (True, "bfloat16", True, ("g", "g_gamma")),
            (False, "bfloat16", False, ("g", "g_gamma")),
            # Half-precision chunk states: the split forward stores them.
            # Known limit (issue 27's note): d_g_gamma, the sum over all
            # 4500 tokens of terms that cancel, comes out 1.16e-2 off in rms
            # ratio with half-precision states (lightning, whose decay gets
            # no gradient, runs these too); float32 states for a g_gamma
            # that needs its gradient are not planned yet (the plan cannot
            # tell whether it does).
            pytest.param(
                False,
                "bfloat16",
                True,
                ("g_gamma",),
                marks=pytest.mark.xfail(strict=True, reason="d_g_gamma with half-precision chunk states"),
            ),
        ],
    )
    def test_split_state_passes_as_planned(self, packed, dtype, reverse, gates):
        # Batch 1 (or 3 packed sequences), two heads, a few thousand
        # tokens: the plan splits the state passes by itself (8 or 24
        # programs against the SMs), into segments of 32 chunks: 3 segments
        # of the batch row's 71 chunks; the packed sequences (700, 0, 4300
        # tokens) span 11, 0 and 68 chunks, so 1, 0 and 3 segments.
        self._skip_unless_gpu()
        x, cu, cots = make_case(
            self.fw, gates=gates, packed=packed, h0=True, B=1, T=4500, HQ=4, H=2, K=128,
            V=128, cu=[0, 700, 700, 5000], seed=14,
        )  # fmt: skip
        plans = chunk_plans(x, cu, reverse, chunk_size=64, dtype=dtype)
        # The segment output pass where chunk states are float32.
        fused = dtype == "float32" or "g" in gates
        assert is_split(plans, fused), "batch 1 at 4500+ tokens should split the state passes"
        check_case(self.fw, self._fn(reverse), x, cu, cots, dtype=dtype, reverse=reverse)

    @pytest.mark.parametrize(
        "packed,dtype,reverse,K,V",
        [
            (False, "bfloat16", False, 128, 128),
            (True, "bfloat16", True, 128, 128),
            (False, "float32", True, 128, 128),
            (True, "bfloat16", False, 128, 64),
            (False, "float16", False, 64, 256),
        ],
    )
    def test_gradient_walks_as_planned(self, packed, dtype, reverse, K, V):
        # Lightning at batch 1 (or 3 packed sequences), two heads, a few
        # thousand tokens: the plan splits by itself and its backward takes
        # the gradient walks, in segments of 32 chunks (the batch row's 71
        # chunks: 3 segments; the packed sequences' 11, 0 and 68: 1, 0, 3),
        # at the tiles the GPU picks, square and not (the dq and dk walks
        # run on V x K tiles).
        self._skip_unless_gpu()
        check_lightning_walks(
            self.fw, reverse=reverse, layer_idx=3, num_layers=8, dtype=dtype, seed=25, packed=packed,
            B=1, T=4500, HQ=2, H=2, K=K, V=V, cu=[0, 700, 700, 5000],
        )  # fmt: skip

    @pytest.mark.parametrize(
        "packed,dtype,gates",
        [
            (False, "bfloat16", ("g",)),
            (True, "bfloat16", ("g",)),
            (False, "float32", ("g",)),
            (False, "bfloat16", ("g_gamma",)),
            (True, "bfloat16", ("g_gamma",)),
        ],
    )
    def test_forward_only_as_planned(self, packed, dtype, gates):
        # A forward no gradient follows, at sizes where the plan gives it its
        # own split (state_split.forward_only_segment_chunks): 2 rows of 32
        # chunks walked whole in training and in segments of 16 here; or two
        # packed sequences of 33 chunks on average, segments of 32 in
        # training and 16 here; half-precision chunk states (g_gamma alone,
        # bf16: lightning's) the same.  The output pass carries the segments
        # itself (no carry launch) and stores the final states.
        self._skip_unless_gpu()
        from core_triton.linear_attn.chunk_fwd_output import chunk_fwd_output_segment_kernel
        from core_triton.linear_attn.state_split import state_split_carry_kernel

        shapes = dict(B=2, T=2048, HQ=8, H=4, K=128, V=128, cu=[0, 2100, 4200])
        x, cu, cots = make_case(self.fw, gates=gates, packed=packed, h0=True, seed=19, **shapes)
        plans = chunk_plans(x, cu, False, chunk_size=64, dtype=dtype)
        assert chunk_fwd_output_segment_kernel in [p.kernel for p in plans.inference]
        assert state_split_carry_kernel not in [p.kernel for p in plans.inference]
        with launched_kernels(self.fw) as kernels:
            check_case(self.fw, self._fn(False), x, cu, cots, dtype=dtype, grads=False)
        assert chunk_fwd_output_segment_kernel in kernels

    @pytest.mark.parametrize("gates", [("g",), ("g_gamma",)])
    def test_forward_only_long_segments_as_planned(self, gates, monkeypatch):
        # The long segments a forward alone takes at one long sequence
        # (state_split.LONG_SEGMENTS; 256 chunks of 64 at T128k on the H100),
        # at the GPU's tiles: segments of 128 chunks here, two of them, since
        # any program count is made to fill a wave.
        self._skip_unless_gpu()
        from core_triton.linear_attn import chunk, state_split

        monkeypatch.setattr(state_split, "LONG_SEGMENTS", (128,))
        monkeypatch.setattr(state_split, "WAVE_FILL", 0.0)
        chunk._make_plans.cache_clear()
        self.fw.clear_caches()
        try:
            shapes = dict(B=1, T=16384, HQ=2, H=2, K=128, V=128, cu=None)
            x, cu, cots = make_case(self.fw, gates=gates, packed=False, h0=True, seed=29, **shapes)
            plans = chunk_plans(x, cu, False, chunk_size=64, dtype="bfloat16")
            assert inference_segments(plans) == [128]
            check_case(self.fw, self._fn(False), x, cu, cots, dtype="bfloat16", grads=False)
        finally:
            chunk._make_plans.cache_clear()
            self.fw.clear_caches()

    def test_64bit_offsets(self):
        # q [1, 66048, 128, 256] bf16 has 2**31 + 2**24 elements; the last
        # sequence starts past element 2**31 of it (a 32-bit index would
        # wrap).  Its output and gradients must equal those of the same
        # sequence run on its own.
        self._skip_unless_gpu()
        fw = self.fw
        T, HQ, H, K, V, tail = 65536 + 512, 128, 128, 256, 16, 96
        assert (T - tail) * HQ * K > 2**31 and (T - tail) * H * K > 2**31
        keys = iter(range(100))

        def rand(shape, dtype="bfloat16", scale=0.5):
            # Drawn on the device: 2**31 numpy normals would take minutes.
            if fw.name == "torch":
                gen = fw.torch.Generator(device=fw.device).manual_seed(next(keys))
                x = fw.torch.randn(shape, generator=gen, device=fw.device, dtype=fw.dtype(dtype))
            else:
                key = fw.jax.random.PRNGKey(next(keys))
                x = fw.jax.random.normal(key, shape, dtype=fw.dtype(dtype))
            return x * scale

        q, k = rand((1, T, HQ, K)), rand((1, T, H, K))
        v, do = rand((1, T, H, V)), rand((1, T, HQ, V))
        g = -abs(rand((1, T, H), "float32", 0.1))
        cu = fw.array([0, T - tail, T], "int32")

        def run(q, k, v, g, do, cu):
            arrays = {"query": q, "key": k, "value": v, "g": g}

            def fn(**kw):
                return fw.api.chunk_linear_attn(**kw, cu_seqlens=cu)

            (o, ht), grads = fw.vjp_many(
                fn, arrays, (do, fw.array(np.zeros((int(cu.shape[0]) - 1, H, K, V))))
            )
            return o, ht, grads

        o, ht, grads = run(q, k, v, g, do, cu)
        s = slice(T - tail, T)
        o2, ht2, grads2 = run(q[:, s], k[:, s], v[:, s], g[:, s], do[:, s], fw.array([0, tail], "int32"))
        assert_close(fw.numpy(o[:, s]), fw.numpy(o2), "bfloat16", "output")
        assert_close(fw.numpy(ht[1:]), fw.numpy(ht2), "bfloat16", "final_state")
        for n in ("query", "key", "value", "g"):
            assert_close(fw.numpy(grads[n][:, s]), fw.numpy(grads2[n]), "bfloat16", n)


# Chunk sizes and head dims whose tiles the shared-memory model shrinks
# (core_triton/linear_attn/shared_memory.py); float32 with 256-token chunks runs on
# 128-token kernel chunks (chunk_linear_attn.kernel_chunk).
LARGE_TILE_CASES = [
    pytest.param(K, BT, dtype, id=f"K{K}-chunk{BT}-{dtype}")
    for K, BT in ((256, 64), (256, 128), (256, 256), (128, 128), (128, 256))
    for dtype in ("bfloat16", "float32")
]


class ChunkLinearAttnLargeTileSuite:
    """GPU only: head dims up to 256 and chunks up to 256 tokens launch
    (their tiles fit in shared memory) and match the float64 reference,
    forward and backward, with both gates, grouped queries and an initial
    state.  Moderate sizes: B=1, T=600, HQ=4, H=2."""

    fw = None

    @pytest.mark.parametrize("K,BT,dtype", LARGE_TILE_CASES)
    @pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
    def test_large_tiles_against_reference(self, K, BT, dtype, reverse):
        from core_triton.common.runtime import interpreter_requested

        if interpreter_requested():
            pytest.skip("GPU-only sizes")
        api = self.fw.api
        x, cu, cots = make_case(
            self.fw, gates=("g", "g_gamma"), packed=False, h0=True, B=1, T=600, HQ=4, H=2, K=K, V=K, seed=3
        )

        def fn(**kw):
            return api.chunk_linear_attn(**kw, reverse=reverse, chunk_size=BT)

        check_case(self.fw, fn, x, cu, cots, dtype=dtype, reverse=reverse)
