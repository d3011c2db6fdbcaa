"""The gated delta rule tests, written once; each framework's test module
subclasses them with its adapter (``fw``).

Every case compares output, final state and every gradient (query, key,
value, beta, g / gk, initial_state) with the float64 loop of
core_triton/delta_rule/naive.py (delta_rule_ref), on the rounded
inputs, with random cotangents for the output and the final state.  Shapes
are small under the interpreter but cross what the kernels tile: several
chunks with a short last one, packed sequences that start mid-chunk with an
empty and a one-token one among them, value heads grouped on key heads, K
!= V, several K and V tiles, decays strong enough that ``exp(-b)`` would
overflow.  GpuSuite runs the configs the GPU picks (K, V of 64, 128, 256,
bfloat16 and float32, hundreds of tokens)."""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
import torch

from core_triton.delta_rule.naive import delta_rule_ref
from tests.reference import assert_close
from tests.suites.kernel_level import KernelLevelCases

# Lengths 40, 0, 1, 59: chunks that start mid-chunk, an empty sequence.
CU_SEQLENS = [0, 40, 40, 41, 100]
GATES = (None, "g", "gk")
MODES = ("chunk", "recurrent")
MATRIX = list(itertools.product(GATES, MODES, [False, True]))
# What every binding runs (kernel_cases False: tests/suites/kernel_level.py):
# no gate and g, both modes, packed and not.  The JAX session has gk too:
# its test_vmap (gk, chunk, batched) against the float64 reference, and
# tests/cross/test_delta_rule_parity.py (gk in both modes, packed, float32
# and bfloat16) the same bits as the PyTorch binding, whose session runs
# every case here.
BINDING_MATRIX = [(None, "chunk", False), ("g", "recurrent", True)]


def _ids(case):
    gate, mode, packed = case
    return f"{gate or 'nogate'}-{mode}-{'packed' if packed else 'batched'}"


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_case(fw, *, gate=None, packed=False, h0=True, B=2, T=70, HK=1, HV=2, K=20, V=12,
              cu=CU_SEQLENS, seed=0, strength=2.0):  # fmt: skip
    """Random inputs (numpy, float64) by argument name, cu_seqlens (a list,
    or None) and the cotangents of (output, final_state).  Keys have norm
    about 1 (as after the models' L2 normalisation); decays are
    ``logsigmoid(N(strength, 1))`` per token (and channel for gk)."""
    rng = np.random.default_rng(seed)
    if packed:
        B, T = 1, cu[-1]
    N = len(cu) - 1 if packed else B
    x = {
        "query": rng.standard_normal((B, T, HK, K)),
        "key": rng.standard_normal((B, T, HK, K)) * K**-0.5,
        "value": rng.standard_normal((B, T, HV, V)),
        "beta": 1.0 / (1.0 + np.exp(-rng.standard_normal((B, T, HV)))),
    }
    if gate == "g":
        x["g"] = logsigmoid(rng.standard_normal((B, T, HV)) + strength)
    elif gate == "gk":
        x["gk"] = logsigmoid(rng.standard_normal((B, T, HV, K)) + strength)
    if h0:
        x["initial_state"] = rng.standard_normal((N, HV, K, V))
    cots = (rng.standard_normal((B, T, HV, V)), rng.standard_normal((N, HV, K, V)))
    return x, (cu if packed else None), cots


def check_case(fw, fn, x, cu, cots, *, dtype="float32", scale=None, l2=False, grads=True):
    """Run ``fn(**inputs, cu_seqlens=...)`` (returning ``(output,
    final_state)``) with query, key, value and beta in ``dtype`` (gates and
    state float32) and compare with the float64 reference."""
    low = ("query", "key", "value", "beta")
    arrays = {n: fw.array(a, dtype if n in low else "float32") for n, a in x.items()}
    cu_arr = None if cu is None else fw.array(cu, "int32")
    do, dht = fw.array(cots[0], dtype), fw.array(cots[1], "float32")

    def call(**inputs):
        return fn(**inputs, cu_seqlens=cu_arr)

    if grads:
        (out, ht), got = fw.vjp_many(call, arrays, (do, dht))
    else:
        out, ht = call(**arrays)
    rounded = {n: fw.numpy(a) for n, a in arrays.items()}
    ref_cots = (fw.numpy(do), fw.numpy(dht)) if grads else None
    ref_out, ref_ht, ref_grads = delta_rule_ref(rounded, scale, cu, l2, ref_cots, torch)
    assert str(out.dtype).split(".")[-1] == dtype
    assert str(ht.dtype).split(".")[-1] == "float32"
    assert_close(fw.numpy(out), ref_out, dtype, "output")
    assert_close(fw.numpy(ht), ref_ht, dtype, "final_state")
    if grads:
        for name in arrays:
            assert str(got[name].dtype).split(".")[-1] == str(arrays[name].dtype).split(".")[-1], name
            assert_close(fw.numpy(got[name]), ref_grads[name], dtype, f"d_{name}")


def chunk_settings(fw, **settings):
    """Plan the chunk mode with core_triton.delta_rule.chunk's module
    settings (``CHUNK``, ``P_IN_INTRA``, ``FUSED_WALK``, ``WU_IN_WALK``,
    ``G_WHOLE``, ``Q_DECAYED``, ``KEEP_MATRICES``, ``KEEP_WU``, ``SUM_DB_IN_DQK``,
    ``HALF_INTERMEDIATES``, ``TILE_OVERRIDES``)
    changed inside the block."""
    from core_triton.delta_rule import chunk

    return module_settings(fw, chunk, **settings)


@contextlib.contextmanager
def module_settings(fw, module, **settings):
    """Plan both modes and the decoding step with ``module``'s settings
    changed inside the block (every plan cache cleared on the way in and
    out)."""
    from core_triton.delta_rule import gated_delta_rule, step

    def clear():
        gated_delta_rule._make_plans.cache_clear()
        step._make.cache_clear()
        fw.clear_caches()

    before = {name: getattr(module, name) for name in settings}
    for name, value in settings.items():
        setattr(module, name, value)
    clear()
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(module, name, value)
        clear()


class DeltaRuleSuite(KernelLevelCases):
    fw = None  # set by the framework's module
    # kernel_cases = False (tests/suites/kernel_level.py): matrix() picks
    # the cross-section.

    def _fn(self, mode, scale=None, l2=False):
        api = self.fw.api

        def fn(**kw):
            return api.gated_delta_rule(
                **kw, softmax_scale=scale, output_final_state=True, use_qk_l2norm=l2, mode=mode
            )

        return fn

    @pytest.mark.parametrize("case", MATRIX, ids=_ids)
    def test_matches_reference(self, case):
        gate, mode, packed = case
        if case not in BINDING_MATRIX:
            self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, packed=packed)
        # L2 normalisation on the packed half of the matrix.
        check_case(self.fw, self._fn(mode, l2=packed), x, cu, cots, l2=packed)

    @pytest.mark.parametrize("mode", MODES)
    def test_grouped_heads_scale_no_initial_state(self, mode):
        if mode != "chunk":
            self._kernel_level()
        # Three value heads per key head, K != V, a given scale.
        x, cu, cots = make_case(self.fw, gate="g", h0=False, B=1, T=45, HK=2, HV=6, K=24, V=12, seed=1)
        check_case(self.fw, self._fn(mode, scale=0.3, l2=True), x, cu, cots, scale=0.3, l2=True)

    @pytest.mark.parametrize("gate", ["g", "gk"])
    def test_short_chunks(self, gate):
        self._kernel_level()
        # 32-token chunks (two row blocks): many chunks, packed mid-chunk.
        x, cu, cots = make_case(self.fw, gate=gate, packed=True, seed=2)
        with chunk_settings(self.fw, CHUNK=32):
            check_case(self.fw, self._fn("chunk"), x, cu, cots)

    @pytest.mark.parametrize("gate", ["g", None])
    @pytest.mark.parametrize("route", ["walk_reads_p", "walk_reads_w_forms_p"])
    def test_where_p_comes_from(self, gate, route):
        # The measured alternatives for scalar (or no) gates: the walk that
        # forms W S and Uv reading P from the intra kernel; the walk that
        # reads W and Uv forming P from q k^T.
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, packed=True, seed=9)
        settings = {
            "walk_reads_p": dict(TILE_OVERRIDES={"walk_wu": {"P_FROM_AQK": True}}),
            "walk_reads_w_forms_p": dict(WU_IN_WALK=False, TILE_OVERRIDES={"walk": {"P_FROM_AQK": False}}),
        }[route]
        with chunk_settings(self.fw, **settings):
            check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, l2=True)

    @pytest.mark.parametrize("gate", ["g", "gk"])
    @pytest.mark.parametrize("in_kernel", [True, False], ids=["in_kernel", "apart"])
    def test_recurrent_l2_norm(self, gate, in_kernel):
        # The recurrent forward normalising q and k rows itself
        # (recurrent.L2_IN_KERNEL, the default) or reading l2norm.py's
        # launches, on rows of norms from 0.2 to 5, packed.
        self._kernel_level()
        from core_triton.delta_rule import gated_delta_rule as core
        from core_triton.delta_rule import recurrent
        from core_triton.delta_rule.l2norm import l2norm_fwd_kernel

        x, cu, cots = make_case(self.fw, gate=gate, packed=True, seed=14)
        rng = np.random.default_rng(14)
        for name in ("query", "key"):
            x[name] = x[name] * rng.uniform(0.2, 5.0, x[name].shape[:-1])[..., None]
        with module_settings(self.fw, recurrent, L2_IN_KERNEL=in_kernel):
            check_case(self.fw, self._fn("recurrent", l2=True), x, cu, cots, l2=True)
            infos = {n: _info(self.fw.array(a)) for n, a in x.items()}
            cu_info = _info(self.fw.array(cu, "int32"))
            plans = core.plans(**infos, cu_seqlens=cu_info, use_qk_l2norm=True, mode="recurrent")
            assert any(p.kernel is l2norm_fwd_kernel for p in plans.forward) is not in_kernel
            assert any(p.kernel is l2norm_fwd_kernel for p in plans.backward)

    @pytest.mark.parametrize("gate", ["g", "gk"])
    def test_state_pass_and_output_kernel(self, gate):
        # The forward's other route (what K > 128 takes: GpuSuite's K = 256
        # cases) at the interpreter's head dims: the state pass stores the
        # chunk states and Kd is stored, a separate kernel forms the
        # outputs.  The backward does not depend on the route.
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, packed=True, seed=10)
        with chunk_settings(self.fw, FUSED_WALK=False):
            check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, l2=True, grads=False)

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_backward_state_pass_forming_decays(self, dtype):
        # The backward state pass's other route: it forms q exp(b) of
        # per-channel gates itself (no Qd from the W/Uv launch).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate="gk", packed=True, seed=13)
        with chunk_settings(self.fw, Q_DECAYED=False):
            check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, dtype=dtype, l2=True)

    @pytest.mark.parametrize("gate,keep", [("g", True), ("gk", True), ("gk", False)])
    def test_backward_state_pass_two_pieces(self, gate, keep):
        # K = 100: the backward state pass holds the state's gradient in two
        # pieces of 64 rows (the second partly past K), carried over three
        # chunks; per-channel gates also with KEEP_MATRICES off (the
        # backward forming P, G and Tinv again).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, B=1, T=150, HV=2, K=100, V=24, seed=18)
        with chunk_settings(self.fw, KEEP_MATRICES=keep):
            check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, l2=True)

    @pytest.mark.parametrize("dtype,packed", [("float32", False), ("bfloat16", True)])
    def test_backward_forming_w_and_uv_again(self, dtype, packed):
        # Per-channel gates with KEEP_WU off: the backward forms W, Uv, Kd and
        # Qd again instead of reading the forward's (KEEP_WU, the default);
        # both with Q_DECAYED off too (no Qd formed or kept).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate="gk", packed=packed, seed=19)
        for keep_wu, q_decayed in ((False, True), (False, False), (True, False)):
            with chunk_settings(self.fw, KEEP_WU=keep_wu, Q_DECAYED=q_decayed):
                check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, dtype=dtype, l2=True)

    @pytest.mark.parametrize("gate,dtype", [("gk", "bfloat16"), ("g", "bfloat16"), ("gk", "float16")])
    def test_scores_in_float16(self, gate, dtype):
        # P_FLOAT16: the decayed scores P stored in float16 (|P| <= 1 with
        # normalised q, k), read by the walk, the backward state pass and
        # the query/key gradient kernel; with KEEP_MATRICES off too (the
        # backward forming P again).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, packed=True, seed=22)
        for keep in (True, False):
            with chunk_settings(self.fw, P_FLOAT16=True, KEEP_MATRICES=keep):
                check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, dtype=dtype, l2=True)

    @pytest.mark.parametrize("packed", [False, True])
    def test_walk_reading_float16_qd(self, packed):
        # WALK_READS_QD: the W/Uv launch stores q exp(b) in float16 (every
        # |q exp(b)| at most 1 with normalised queries), which the walk reads
        # in place of q and the float32 decays; the backward state pass reads
        # it too (rounded to do's bf16), or forms its own (KEEP_WU off).
        # Batched: with W, Uv, Kd in float32, whose bf16 rounding takes this
        # case's final state past the bound whatever the walk reads (1.02e-2;
        # test_half_precision_float32_intermediates, docs/api.md).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate="gk", packed=packed, seed=20)
        for keep_wu in (True, False):
            settings = dict(WALK_READS_QD=True, KEEP_WU=keep_wu, HALF_INTERMEDIATES=packed)
            with chunk_settings(self.fw, **settings):
                check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, dtype="bfloat16", l2=True)

    @pytest.mark.parametrize("dtype,packed,strength", [("float32", False, -2.0), ("bfloat16", True, 2.0)])
    def test_gate_gradient_summed_in_dqk(self, dtype, packed, strength):
        # SUM_DB_IN_DQK: the query/key gradient kernel forms gk's gradient
        # (db's reverse in-chunk cumsum) itself, no cumsum launch; float32
        # with strong decays, so that the sums' terms differ in size.
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate="gk", packed=packed, seed=15, strength=strength)
        with chunk_settings(self.fw, SUM_DB_IN_DQK=True):
            check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, dtype=dtype, l2=True)

    @pytest.mark.parametrize("gate", ["g", None])
    def test_walk_reading_w_and_uv(self, gate):
        # Scalar (or no) gates' fused walk reading W and Uv from their own
        # launch (chunk_fwd_wu.py), the measured alternative to forming
        # them; and the intra kernel forming G block by block from k's
        # blocks instead of whole.  (Per-channel gates always read them.)
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, packed=True, seed=12)
        with chunk_settings(self.fw, WU_IN_WALK=False, G_WHOLE=False):
            check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, l2=True, grads=False)

    @pytest.mark.parametrize(
        "K,V,gate", [(64, 64, "g"), (128, 128, "g"), (40, 100, "gk"), (128, 40, "gk")], ids=str
    )
    def test_head_dims(self, K, V, gate):
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, B=1, T=20, HK=1, HV=1, K=K, V=V, seed=3)
        for mode in MODES:
            check_case(self.fw, self._fn(mode, l2=True), x, cu, cots, l2=True)

    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    def test_half_precision(self, dtype, mode):
        # Kernel-level: the JAX session checks its binding's bfloat16 in
        # tests/cross/test_delta_rule_parity.py (the PyTorch binding's bits,
        # chunk and recurrent).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate="gk" if dtype == "bfloat16" else "g", packed=True, seed=4)
        check_case(self.fw, self._fn(mode, l2=True), x, cu, cots, dtype=dtype, l2=True)

    @pytest.mark.parametrize("mode", MODES)
    def test_gradient_sums_in_l2norm(self, mode):
        # steps.SUMS_IN_L2NORM: the normalisation's backward sums the
        # query/key partials (two value heads per key head here) itself:
        # against the reference, and bit for bit the reduction launch's
        # route (the same float32 sums in the same order).
        from core_triton.delta_rule import steps

        self._kernel_level()
        fw = self.fw
        x, cu, cots = make_case(fw, gate="gk", packed=True, seed=17)
        fn = self._fn(mode, l2=True)
        arrays = {n: fw.array(a) for n, a in x.items()}
        cu_arr = fw.array(cu, "int32")
        cot = (fw.array(cots[0]), fw.array(cots[1]))

        def grads():
            _, got = fw.vjp_many(lambda **kw: fn(**kw, cu_seqlens=cu_arr), arrays, cot)
            return {n: fw.numpy(g) for n, g in got.items() if n in ("query", "key")}

        with module_settings(fw, steps, SUMS_IN_L2NORM=False):
            apart = grads()
        with module_settings(fw, steps, SUMS_IN_L2NORM=True):
            check_case(fw, fn, x, cu, cots, l2=True)
            fused = grads()
        for name in ("query", "key"):
            np.testing.assert_array_equal(fused[name], apart[name], err_msg=name)

    @pytest.mark.parametrize("gate", GATES)
    def test_half_precision_float32_intermediates(self, gate):
        # bf16, batched, with W, Uv, Kd, Qd in float32 and the walk's k
        # products widened (HALF_INTERMEDIATES off).  With them in bf16 (the
        # default: faster, chunk.py) this case is past the 1e-2 bound: no
        # gate's final state 1.16e-2 of its scale, d_key 1.2e-2; per-channel
        # gates' final state 1.08e-2 (docs/api.md says so).
        self._kernel_level()
        x, cu, cots = make_case(self.fw, gate=gate, seed=16)
        with chunk_settings(self.fw, HALF_INTERMEDIATES=False):
            check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, dtype="bfloat16", l2=True)

    @pytest.mark.parametrize("gate", ["g", "gk"])
    def test_repeated_keys_half_precision(self, gate):
        self._kernel_level()
        # One key for every token, beta near 1 and decays near 1: the
        # diagonal blocks of I + diag(beta) G are then near I + (all ones
        # below the diagonal), where the half-precision inverse's squaring
        # (chunk_common.unit_lower_inverse) cancels the most.
        x, cu, cots = make_case(self.fw, gate=gate, B=1, T=80, strength=8.0, seed=14)
        x["key"] = np.broadcast_to(x["key"][:, :1], x["key"].shape).copy()
        x["beta"] = 0.97 + 0.02 * x["beta"]
        # The forward: the key gradient's terms cancel here beyond bfloat16's
        # tolerance whichever way the inverse is formed (1.1e-2 of its scale
        # with forward substitution too).
        check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, dtype="bfloat16", l2=True, grads=False)

    @pytest.mark.parametrize("mode", MODES)
    def test_empty_sequences(self, mode):
        self._kernel_level()
        # Empty sequences pass the initial state (and its gradient) through.
        x, cu, cots = make_case(self.fw, gate="g", packed=True, cu=[0, 0, 30, 30], seed=5)
        check_case(self.fw, self._fn(mode), x, cu, cots)

    @pytest.mark.parametrize("gate,strength", [("g", -4.0), ("gk", -4.0), ("gk", -9.0)])
    def test_strong_decays(self, gate, strength):
        self._kernel_level()
        # Decays near exp(-4) a token: over a 64-token chunk exp(-b) would
        # be exp(256), past float32; the kernels only form exp(b_i - b_j <=
        # 0), or (gk's diagonal blocks) products through the block's middle
        # row, whose factors stay within exp(+-60).  Near exp(-9) a token
        # most of gk's diagonal blocks pass that bound (half a block: 72)
        # and take the column loop, some do not (logsigmoid's spread).
        x, cu, cots = make_case(self.fw, gate=gate, B=1, T=130, strength=strength, seed=6)
        check_case(self.fw, self._fn("chunk", l2=True), x, cu, cots, l2=True)

    def test_modes_agree(self):
        self._kernel_level()
        fw = self.fw
        x, cu, cots = make_case(fw, gate="gk", packed=True, seed=7)
        arrays = {n: fw.array(a) for n, a in x.items()}
        cu_arr = fw.array(cu, "int32")
        results = []
        for mode in MODES:

            def call(mode=mode, **inputs):
                return fw.api.gated_delta_rule(
                    **inputs, output_final_state=True, cu_seqlens=cu_arr, use_qk_l2norm=True, mode=mode
                )

            results.append(fw.vjp_many(call, arrays, tuple(fw.array(c) for c in cots)))
        (o1, h1), g1 = results[0]
        (o2, h2), g2 = results[1]
        assert_close(fw.numpy(o1), fw.numpy(o2), "float32", "output")
        assert_close(fw.numpy(h1), fw.numpy(h2), "float32", "final_state")
        for n in arrays:
            assert_close(fw.numpy(g1[n]), fw.numpy(g2[n]), "float32", f"d_{n}")

    def test_auto_mode_and_final_state(self):
        from core_triton.delta_rule import gated_delta_rule as core
        from core_triton.delta_rule.chunk_intra import delta_chunk_intra_kernel

        fw, api = self.fw, self.fw.api
        for T, chunked in ((64, False), (65, True)):
            x, _, _ = make_case(fw, gate="g", B=1, T=T, h0=False, seed=8)
            arrays = {n: fw.array(a) for n, a in x.items()}
            infos = {n: _info(a) for n, a in arrays.items()}
            plans = core.plans(*(infos[n] for n in ("query", "key", "value", "beta")), g=infos["g"])
            assert any(p.kernel is delta_chunk_intra_kernel for p in plans.forward) == chunked
            out, final = api.gated_delta_rule(**arrays)
            assert final is None
            ref, _, _ = delta_rule_ref({n: fw.numpy(a) for n, a in arrays.items()})
            assert_close(fw.numpy(out), ref, "float32", "output")

    # ---- bad input -------------------------------------------------------

    def _inputs(self, **shapes):
        fw = self.fw
        rng = np.random.default_rng(9)
        base = {"query": (2, 5, 2, 3), "key": (2, 5, 2, 3), "value": (2, 5, 4, 6)}
        base["beta"] = (2, 5, 4)
        base.update(shapes)
        return {n: fw.array(rng.random(s)) for n, s in base.items() if s is not None}

    def test_bad_arguments(self):
        fw, api = self.fw, self.fw.api
        shape_cases = [
            ({"query": (2, 5, 2)}, ValueError, "query"),
            ({"key": (2, 5, 2, 4)}, ValueError, "key"),
            ({"value": (2, 6, 4, 6)}, ValueError, "value"),
            ({"value": (2, 5, 3, 6)}, ValueError, "multiple"),
            ({"beta": (2, 5, 2)}, ValueError, "beta"),
            ({"query": (2, 5, 2, 300), "key": (2, 5, 2, 300)}, ValueError, "head_dim"),
            ({"g": (2, 5, 2)}, ValueError, "g must be"),
            ({"gk": (2, 5, 4, 6)}, ValueError, "gk must be"),
            ({"g": (2, 5, 4), "gk": (2, 5, 4, 3)}, ValueError, "alternatives"),
            ({"initial_state": (2, 4, 6, 3)}, ValueError, "initial_state"),
        ]
        for shapes, err, match in shape_cases:
            with pytest.raises(err, match=match):
                api.gated_delta_rule(**self._inputs(**shapes))
        x = self._inputs()
        for kwargs, err, match in [
            ({"mode": "fused"}, ValueError, "mode"),
            ({"mode": None}, ValueError, "mode"),
            ({"use_qk_l2norm": 1}, TypeError, "use_qk_l2norm"),
            ({"output_final_state": "yes"}, TypeError, "output_final_state"),
            ({"softmax_scale": float("inf")}, ValueError, "softmax_scale"),
            ({"cu_seqlens": fw.array([0, 2, 5], "int32")}, ValueError, "batch"),
            ({"cu_seqlens": fw.array([0.0, 5.0])}, TypeError, "cu_seqlens"),
            ({"g": fw.array(np.zeros((2, 5, 4)), "int32")}, TypeError, "g"),
        ]:
            with pytest.raises(err, match=match):
                api.gated_delta_rule(**x, **kwargs)
        with pytest.raises(TypeError, match="dtype"):
            api.gated_delta_rule(
                x["query"], x["key"], fw.array(np.zeros((2, 5, 4, 6)), "bfloat16"), x["beta"]
            )


def _info(a):
    from core_triton.common.launch import TensorInfo
    from core_triton.common.utils import contiguous_strides

    dtype = str(a.dtype).split(".")[-1]
    return TensorInfo(tuple(a.shape), dtype, contiguous_strides(a.shape))


class DeltaRuleStepSuite:
    """``gated_delta_rule_step``: the recurrent forward on a carried state."""

    fw = None

    @pytest.mark.parametrize("gate", GATES)
    @pytest.mark.parametrize("T", [1, 3])
    def test_matches_reference(self, gate, T):
        fw = self.fw
        x, _, _ = make_case(fw, gate=gate, B=3, T=T, HK=2, HV=4, K=16, V=8, seed=10)
        state0 = x.pop("initial_state")
        arrays = {n: fw.array(a) for n, a in x.items()}
        out, state = self._step(arrays, fw.array(state0))
        ref_out, ref_state, _ = delta_rule_ref({**{n: fw.numpy(a) for n, a in arrays.items()},
                                                "initial_state": state0}, use_qk_l2norm=True)  # fmt: skip
        assert_close(fw.numpy(out), ref_out, "float32", "output")
        assert_close(fw.numpy(state), ref_state, "float32", "state")

    def _step(self, arrays, state):
        return self.fw.api.gated_delta_rule_step(**arrays, state=state, use_qk_l2norm=True)

    def test_bad_state(self):
        fw = self.fw
        x, _, _ = make_case(fw, gate="g", B=2, T=1, K=4, V=3, seed=11)
        state = x.pop("initial_state")
        arrays = {n: fw.array(a) for n, a in x.items()}
        with pytest.raises(TypeError, match="state must be float32"):
            fw.api.gated_delta_rule_step(**arrays, state=fw.array(state, "bfloat16"))
        with pytest.raises(ValueError, match="initial_state"):
            fw.api.gated_delta_rule_step(**arrays, state=fw.array(state[:1]))
        with pytest.raises(TypeError, match="state"):
            fw.api.gated_delta_rule_step(**arrays, state=None)


# Tests that take tens of GB of GPU memory carry this mark: gpu_run.sh runs
# them after the rest, one after another (-m xdist_group).
class DeltaRuleGpuSuite:
    """The configs the GPU picks (they follow K, V and the dtype, never the
    length): head dims 64, 128 and 256 and K != V, bfloat16 and float32,
    grouped value heads, packed documents over several 64-token chunks,
    both modes, every gradient against float64."""

    fw = None

    def _skip_unless_gpu(self):
        from core_triton.common.runtime import interpreter_requested

        if interpreter_requested():
            pytest.skip("GPU-only sizes")

    @pytest.mark.parametrize("K,V", [(128, 128), (64, 64), (256, 256), (128, 64), (64, 256)], ids=str)
    @pytest.mark.parametrize("gate", GATES)
    @pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
    def test_gpu_configs_against_reference(self, K, V, gate, dtype):
        self._skip_unless_gpu()
        x, cu, cots = make_case(self.fw, gate=gate, packed=True, HK=2, HV=4, K=K, V=V,
                                cu=[0, 150, 150, 151, 420], seed=12)  # fmt: skip
        for mode in MODES:
            fn = DeltaRuleSuite._fn(self, mode, l2=True)
            check_case(self.fw, fn, x, cu, cots, dtype=dtype, l2=True)

    @pytest.mark.parametrize("gate", ["g", "gk"])
    def test_long_sequence_modes_agree(self, gate):
        # 8k tokens in bfloat16: the chunk path against the recurrent one.
        self._skip_unless_gpu()
        fw = self.fw
        x, _, cots = make_case(fw, gate=gate, B=1, T=8192, HK=2, HV=4, K=128, V=128, seed=13)
        arrays = {n: fw.array(a, "bfloat16" if n in ("query", "key", "value", "beta") else "float32")
                  for n, a in x.items()}  # fmt: skip
        outs = []
        for mode in MODES:

            def call(mode=mode, **inputs):
                return fw.api.gated_delta_rule(
                    **inputs, output_final_state=True, use_qk_l2norm=True, mode=mode
                )

            outs.append(fw.vjp_many(call, arrays, (fw.array(cots[0], "bfloat16"), fw.array(cots[1]))))
        (o1, h1), g1 = outs[0]
        (o2, h2), g2 = outs[1]
        assert_close(fw.numpy(o1), fw.numpy(o2), "bfloat16", "output")
        assert_close(fw.numpy(h1), fw.numpy(h2), "bfloat16", "final_state")
        for n in arrays:
            assert_close(fw.numpy(g1[n]), fw.numpy(g2[n]), "bfloat16", f"d_{n}")
