"""The recurrent linear-attention tests, written once; each framework's test
module subclasses them with its adapter (``fw``).  ``make_case`` and
``check_case`` are shared with the chunk and lightning suites."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from core_triton.linear_attn.naive import linear_attention_ref
from tests.reference import assert_close
from tests.suites.kernel_level import KernelLevelCases

# Packed sequences: an empty one, lengths of 1 and several tokens; T = 23.
CU_SEQLENS = [0, 5, 5, 6, 23]
GATE_SETS = [(), ("g",), ("g_gamma",), ("gk",), ("gv",), ("g", "g_gamma", "gk", "gv")]
MATRIX = list(itertools.product(GATE_SETS, [False, True], [False, True], [False, True]))
# A cross-section: per gate set one (reverse, packed, h0) combination, in
# turn so that every option takes both values, and with every gate at once
# the complement too: what a binding whose kernel_cases is False runs
# (tests/suites/kernel_level.py; the gates are the kernels' matter, the
# binding passes them on).
_COMBOS = list(itertools.product([False, True], [False, True], [False, True]))
BINDING_MATRIX = [(gates, *_COMBOS[(3 * i) % 8]) for i, gates in enumerate(GATE_SETS)]
BINDING_MATRIX.append((GATE_SETS[-1], *_COMBOS[7 - (3 * (len(GATE_SETS) - 1)) % 8]))


def _ids(case):
    gates, reverse, packed, h0 = case
    return "-".join(
        ["+".join(gates) or "nogate", "rev" if reverse else "fwd", "packed" if packed else "batched"]
        + (["h0"] if h0 else [])
    )


def logsigmoid(x):
    return -np.logaddexp(0.0, -x)


def make_case(
    fw,
    *,
    gates=(),
    packed=False,
    h0=False,
    B=2,
    T=11,
    HQ=4,
    H=2,
    K=6,
    V=5,
    cu=CU_SEQLENS,
    seed=0,
    dtype="float32",
):
    """Random inputs (numpy, float64) by argument name, cu_seqlens (list or
    None) and the cotangents of (output, final_state)."""
    rng = np.random.default_rng(seed)
    if packed:
        B, T = 1, cu[-1]
    N = len(cu) - 1 if packed else B
    x = {
        "query": rng.standard_normal((B, T, HQ, K)),
        "key": rng.standard_normal((B, T, H, K)),
        "value": rng.standard_normal((B, T, H, V)),
    }
    shapes = {"g": (B, T, H), "g_gamma": (H,), "gk": (B, T, H, K), "gv": (B, T, H, V)}
    for name in gates:
        # Decays in (0, 1): log-sigmoid of random logits, shifted so that
        # states neither vanish nor stay constant over the sequence.
        x[name] = logsigmoid(rng.standard_normal(shapes[name]) + 2.0)
    if h0:
        x["initial_state"] = rng.standard_normal((N, H, K, V))
    cots = (rng.standard_normal((B, T, HQ, V)), rng.standard_normal((N, H, K, V)))
    return x, (cu if packed else None), cots


def check_case(
    fw, fn, x, cu, cots, *, dtype="float32", scale=None, reverse=False, grads=True, ref_extra=None
):
    """Run ``fn(**inputs, cu_seqlens=...)`` in ``dtype`` (states and gates in
    float32) and compare output, final state and every gradient with the
    float64 reference on the same (rounded) inputs."""
    arrays = {n: fw.array(a, dtype if n in ("query", "key", "value") else "float32") for n, a in x.items()}
    cu_arr = None if cu is None else fw.array(cu, "int32")
    do = fw.array(cots[0], dtype)
    dht = fw.array(cots[1], "float32")

    def call(**inputs):
        return fn(**inputs, cu_seqlens=cu_arr)

    if grads:
        (out, ht), got = fw.vjp_many(call, arrays, (do, dht))
    else:
        out, ht = call(**arrays)
    rounded = {n: fw.numpy(a) for n, a in arrays.items()}
    if ref_extra:
        rounded.update(ref_extra)
    if grads and "g_gamma" in rounded and "g" not in rounded:
        # A zero per-token gate changes nothing but makes the reference
        # report the per-token decay gradients that d_g_gamma sums.
        rounded["g"] = np.zeros(rounded["query"].shape[:2] + rounded["g_gamma"].shape)
    ref_out, ref_ht, ref_grads = linear_attention_ref(
        rounded, scale, reverse, cu, fw.numpy(do) if grads else None, fw.numpy(dht) if grads else None, torch
    )
    assert str(out.dtype).split(".")[-1] == dtype
    assert str(ht.dtype).split(".")[-1] == "float32"
    assert_close(fw.numpy(out), ref_out, dtype, "output")
    assert_close(fw.numpy(ht), ref_ht, "float32" if dtype == "float32" else dtype, "final_state")
    if grads:
        for name in arrays:
            assert str(got[name].dtype).split(".")[-1] == str(arrays[name].dtype).split(".")[-1], name
            # d_g_gamma sums the per-token decay gradients of every sequence,
            # which cancel: its scale is the sum of their sizes.
            size = np.abs(ref_grads["g"]).sum(axis=(0, 1)) if name == "g_gamma" else None
            assert_close(fw.numpy(got[name]), ref_grads[name], dtype, f"d_{name}", scale=size)


class RecurrentSuite(KernelLevelCases):
    fw = None  # set by the framework's module

    def _fn(self, scale=None, reverse=False):
        api = self.fw.api

        def fn(**kw):
            return api.recurrent(**kw, softmax_scale=scale, reverse=reverse)

        return fn

    @pytest.mark.parametrize("case", MATRIX, ids=_ids)
    def test_matches_reference(self, case):
        self._kernel_level(case in BINDING_MATRIX)
        gates, reverse, packed, h0 = case
        x, cu, cots = make_case(self.fw, gates=gates, packed=packed, h0=h0)
        check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, reverse=reverse)

    @pytest.mark.parametrize("gates", [("g", "gk"), ("g_gamma", "gv")])
    def test_scale_and_one_query_head_per_state(self, gates):
        x, cu, cots = make_case(self.fw, gates=gates, HQ=3, H=3, K=7, V=3, h0=True, seed=1)
        check_case(self.fw, self._fn(scale=0.3), x, cu, cots, scale=0.3)

    @pytest.mark.parametrize("reverse", [False, True])
    def test_several_value_tiles(self, reverse):
        # V = 40 splits into value tiles of 16: partial dq/dk/dg are summed.
        self._kernel_level()
        x, cu, cots = make_case(
            self.fw, gates=("g", "g_gamma", "gk", "gv"), packed=True, h0=True, K=12, V=40, H=1, HQ=2, seed=2
        )
        check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, reverse=reverse)

    def test_large_odd_head_dims(self):
        x, cu, cots = make_case(self.fw, gates=("g", "gk"), B=1, T=4, HQ=1, H=1, K=100, V=80, seed=3)
        check_case(self.fw, self._fn(), x, cu, cots)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    @pytest.mark.parametrize("reverse", [False, True])
    def test_half_precision(self, dtype, reverse):
        # The binding's part: one dtype each way (both halves: the kernels').
        self._kernel_level((dtype == "bfloat16") != reverse)
        x, cu, cots = make_case(self.fw, gates=("g", "g_gamma", "gk", "gv"), packed=True, h0=True, seed=4)
        check_case(self.fw, self._fn(reverse=reverse), x, cu, cots, dtype=dtype, reverse=reverse)

    def test_empty_sequences_and_zero_length(self):
        # Sequences of length 0 pass the initial state through unchanged.
        x, cu, cots = make_case(self.fw, gates=("g",), packed=True, h0=True, cu=[0, 0, 4, 4], seed=5)
        check_case(self.fw, self._fn(), x, cu, cots)

    # ---- bad input -------------------------------------------------------

    def _inputs(self, **shapes):
        fw = self.fw
        rng = np.random.default_rng(9)
        base = {"query": (2, 5, 4, 3), "key": (2, 5, 2, 3), "value": (2, 5, 2, 4)}
        base.update(shapes)
        return {n: fw.array(rng.standard_normal(s)) for n, s in base.items() if s is not None}

    def test_bad_shapes(self):
        api = self.fw.api
        cases = [
            ({"query": (2, 5, 4)}, "query"),
            ({"key": (2, 6, 2, 3)}, "seq_len"),
            ({"key": (2, 5, 2, 4)}, "head_dim"),
            ({"value": (2, 5, 3, 4)}, "heads"),
            ({"query": (2, 5, 3, 3)}, "multiple"),
            ({"query": (2, 5, 4, 300), "key": (2, 5, 2, 300)}, "head_dim"),
            ({"g": (2, 5, 3)}, "g must be"),
            ({"g_gamma": (1, 2)}, "g_gamma"),
            ({"gk": (2, 5, 2, 4)}, "gk"),
            ({"gv": (2, 5, 2, 3)}, "gv"),
            ({"initial_state": (2, 2, 4, 3)}, "initial_state"),
        ]
        for shapes, match in cases:
            with pytest.raises(ValueError, match=match):
                api.recurrent(**self._inputs(**shapes))

    def test_bad_types_and_options(self):
        fw, api = self.fw, self.fw.api
        x = self._inputs()
        with pytest.raises(TypeError, match="dtype"):
            api.recurrent(x["query"], x["key"], fw.array(np.zeros((2, 5, 2, 4)), "bfloat16"))
        with pytest.raises(TypeError, match="query"):
            api.recurrent(fw.array(np.zeros((2, 5, 4, 3)), "int32"), x["key"], x["value"])
        with pytest.raises(TypeError, match="g"):
            api.recurrent(**x, g=fw.array(np.zeros((2, 5, 2)), "int32"))
        with pytest.raises(TypeError, match="reverse"):
            api.recurrent(**x, reverse=1)
        with pytest.raises(ValueError, match="softmax_scale"):
            api.recurrent(**x, softmax_scale=float("inf"))
        with pytest.raises(ValueError, match="batch"):
            api.recurrent(**x, cu_seqlens=fw.array([0, 2, 5], "int32"))
        one = self._inputs(query=(1, 5, 4, 3), key=(1, 5, 2, 3), value=(1, 5, 2, 4))
        for values in ([0, 2, 4], [1, 2, 5], [0, 3, 2, 5]):
            with pytest.raises(ValueError, match="cu_seqlens"):
                api.check_cu_seqlens(fw.array(values, "int32"), one["query"].shape[1])
        with pytest.raises(ValueError, match="initial_state"):
            api.recurrent(
                **one, cu_seqlens=fw.array([0, 2, 5], "int32"), initial_state=fw.array(np.zeros((1, 2, 3, 4)))
            )
