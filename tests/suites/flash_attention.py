"""The flash-attention tests, written once; tests/torch and tests/jax
subclass them with their framework adapter (``fw``).

Shapes stay tiny (the CPU runs Triton's interpreter, 32x32 blocks there),
but long enough that every sequence spans several blocks and ends mid-block.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.reference import assert_close
from tests.reference_attention import attention_ref

DIFFERENTIABLE = ("query", "key", "value", "softmax_aux", "bias")
INDEX = ("q_segment_ids", "kv_segment_ids", "q_positions", "kv_positions")


def vjp(fw, fn, inputs: dict, cotangents: tuple):
    """(fn(**inputs), {name: gradient}) for ``fn`` returning a tuple."""
    if fw.name == "torch":
        leaves = {n: x.detach().clone().requires_grad_(True) for n, x in inputs.items()}
        outs = fn(**leaves)
        fw.torch.autograd.backward(list(outs), list(cotangents))
        return outs, {n: x.grad for n, x in leaves.items()}
    outs, pullback = fw.jax.vjp(lambda d: fn(**d), inputs)
    (grads,) = pullback(tuple(cotangents))
    return outs, grads


def make_case(rng, B=1, Tq=45, Tk=45, HQ=4, H=2, D=16, Dv=None, sink=None, bias=None, seg=None, pos=None):
    """Random inputs (float64 numpy).  ``sink``: None, "1d" or "2d";
    ``bias``: None or its shape as a string of 'B'/'1', 'H'/'1'; ``seg``:
    None, "q" (one array for both) or "both"; ``pos``: None, "2d" or "1d"."""
    Dv = D if Dv is None else Dv
    c = {
        "query": rng.standard_normal((B, Tq, HQ, D)),
        "key": rng.standard_normal((B, Tk, H, D)),
        "value": rng.standard_normal((B, Tk, H, Dv)),
    }
    if sink == "1d":
        c["softmax_aux"] = rng.standard_normal(HQ)
    elif sink == "2d":
        c["softmax_aux"] = rng.standard_normal((HQ, 3))
    if bias is not None:
        shape = (B if bias[0] == "B" else 1, HQ if bias[1] == "H" else 1, Tq, Tk)
        c["bias"] = rng.standard_normal(shape)
    if seg == "q":
        c["q_segment_ids"] = np.sort(rng.integers(0, 3, (B, Tq))).astype(np.int32)
    elif seg == "both":
        c["q_segment_ids"] = np.sort(rng.integers(0, 3, (B, Tq))).astype(np.int32)
        c["kv_segment_ids"] = np.sort(rng.integers(0, 3, (B, Tk))).astype(np.int32)
    if pos == "2d":
        c["q_positions"] = (np.arange(Tq)[None] + rng.integers(0, 8, (B, 1))).astype(np.int32)
        c["kv_positions"] = np.stack([rng.permutation(Tk) for _ in range(B)]).astype(np.int32)
    elif pos == "1d":
        c["q_positions"] = (np.arange(Tq) * 2).astype(np.int32)
    return c


# name -> (shape/input options, op options)
FEATURES = {
    "plain": ({}, {}),
    "mha_batch2": ({"B": 2, "HQ": 2, "H": 2}, {}),
    "gqa_4to1": ({"HQ": 4, "H": 1}, {}),
    "causal": ({}, {"causal": True}),
    "causal_tq_gt_tk": ({"Tq": 70, "Tk": 37}, {"causal": True}),
    "causal_tq_lt_tk": ({"Tq": 20, "Tk": 75}, {"causal": True}),
    "window_int": ({"Tq": 70, "Tk": 70}, {"sliding_window": 9}),
    "window_left_right": ({"Tq": 70, "Tk": 70}, {"sliding_window": (20, 3)}),
    "window_causal": ({"Tq": 70, "Tk": 70}, {"sliding_window": (12, 0), "causal": True}),
    "soft_cap": ({}, {"logits_soft_cap": 1.5}),
    "scale": ({}, {"softmax_scale": 0.7}),
    "sink_1d": ({"sink": "1d"}, {}),
    "sink_2d_causal": ({"sink": "2d"}, {"causal": True}),
    "bias_full": ({"bias": "BH", "B": 2}, {}),
    "bias_broadcast": ({"bias": "11", "B": 2}, {"causal": True}),
    "bias_per_head": ({"bias": "1H", "B": 2}, {}),
    "segments_one_array": ({"seg": "q"}, {}),
    "segments_both_tq_ne_tk": ({"seg": "both", "Tq": 40, "Tk": 66}, {"causal": True}),
    "positions_explicit": ({"pos": "2d", "B": 2}, {"causal": True}),
    "positions_q_only": ({"pos": "1d", "Tq": 30, "Tk": 70}, {"sliding_window": (6, 2)}),
    "head_dim_80_dv_100": ({"D": 80, "Dv": 100, "HQ": 2, "H": 1, "Tq": 35, "Tk": 40}, {"causal": True}),
    "head_dim_24_dv_8": ({"D": 24, "Dv": 8}, {}),
}

COMBINED = {
    "all_offsets": (
        {"sink": "2d", "bias": "1H", "seg": "q", "HQ": 4, "H": 2, "Tq": 70, "Tk": 70},
        {"causal": True, "sliding_window": (30, 5), "logits_soft_cap": 2.0, "softmax_scale": 0.3},
    ),
    "all_explicit": (
        {
            "sink": "1d",
            "bias": "B1",
            "seg": "both",
            "pos": "2d",
            "B": 2,
            "Tq": 50,
            "Tk": 50,
            "D": 20,
            "Dv": 12,
        },
        {"causal": True, "sliding_window": 25, "logits_soft_cap": 3.0},
    ),
    "gqa_window_cap_tq_ne_tk": (
        {"HQ": 6, "H": 2, "Tq": 66, "Tk": 41, "D": 48, "Dv": 40, "sink": "1d"},
        {"sliding_window": (10, 30), "logits_soft_cap": 1.0},
    ),
}


class FlashAttentionSuite:
    fw = None  # set by the framework's module

    def _arrays(self, case, dtype):
        fw = self.fw
        out = {}
        for name, value in case.items():
            if name in INDEX:
                out[name] = fw.array(value, "int32")
            else:
                # The sinks and the bias keep float32: they are small, and
                # their own precision is not what a half-precision test probes.
                out[name] = fw.array(value, dtype if name in ("query", "key", "value") else "float32")
        return out

    def _check(self, case, options, dtype="float32", seed=1, dlse=False):
        fw = self.fw
        rng = np.random.default_rng(seed)
        arrays = self._arrays(case, dtype)
        diff = {n: a for n, a in arrays.items() if n in DIFFERENTIABLE}
        index = {n: a for n, a in arrays.items() if n in INDEX}
        B, Tq, HQ = case["query"].shape[:3]
        do = rng.standard_normal((B, Tq, HQ, case["value"].shape[3]))
        dl = rng.standard_normal((B, HQ, Tq)) if dlse else np.zeros((B, HQ, Tq))

        def fn(**d):
            return fw.api.flash_attention(**d, **index, **options, return_lse=True)

        (out, lse), grads = vjp(fw, fn, diff, (fw.array(do, dtype), fw.array(dl, "float32")))
        # The reference sees the inputs as the kernel saw them (rounded).
        seen = {n: fw.numpy(a) if n in DIFFERENTIABLE else case[n] for n, a in arrays.items()}
        ref = attention_ref(**seen, **options, do=fw.numpy(fw.array(do, dtype)), dlse=dl if dlse else None)
        assert str(out.dtype).split(".")[-1] == dtype
        assert_close(fw.numpy(out), ref["out"], dtype, "output")
        lse_np = fw.numpy(lse)
        finite = np.isfinite(ref["lse"])
        assert np.array_equal(np.isfinite(lse_np), finite), "lse: -inf rows differ"
        assert_close(lse_np[finite], ref["lse"][finite], dtype, "lse")
        names = {"query": "dq", "key": "dk", "value": "dv", "softmax_aux": "dsink", "bias": "dbias"}
        for name, g in grads.items():
            assert str(g.dtype).split(".")[-1] == str(diff[name].dtype).split(".")[-1], name
            assert_close(fw.numpy(g), ref[names[name]], dtype, f"gradient of {name}")

    @pytest.mark.parametrize("feature", sorted(FEATURES))
    def test_feature(self, feature):
        shape, options = FEATURES[feature]
        self._check(make_case(np.random.default_rng(0), **shape), options)

    @pytest.mark.parametrize("combo", sorted(COMBINED))
    def test_combined(self, combo):
        shape, options = COMBINED[combo]
        self._check(make_case(np.random.default_rng(2), **shape), options)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    def test_half_precision(self, dtype):
        shape, options = COMBINED["all_offsets"]
        self._check(make_case(np.random.default_rng(3), **shape), options, dtype=dtype)

    def test_bfloat16_plain_causal(self):
        self._check(make_case(np.random.default_rng(4), Tq=70, Tk=70, D=64), {"causal": True}, "bfloat16")

    def test_gradient_through_lse(self):
        shape, options = FEATURES["sink_2d_causal"]
        self._check(make_case(np.random.default_rng(5), **shape), options, dlse=True)

    def test_rows_with_no_allowed_key(self):
        # Queries at positions before every key (causal), and a query segment
        # that no key has: output 0, lse -inf, every gradient finite (0 for
        # those rows), never NaN.
        fw = self.fw
        rng = np.random.default_rng(6)
        case = make_case(rng, Tq=40, Tk=40)
        case["q_positions"] = (np.arange(40) - 10).astype(np.int32)
        case["q_segment_ids"] = np.where(np.arange(40) < 30, 0, 7)[None].astype(np.int32)
        case["kv_segment_ids"] = np.zeros((1, 40), np.int32)
        self._check(case, {"causal": True})
        arrays = self._arrays(case, "float32")
        out = fw.api.flash_attention(**arrays, causal=True)
        out = fw.numpy(out)
        assert np.all(out[0, :10] == 0) and np.all(out[0, 30:] == 0)
        assert np.all(np.isfinite(out))

    def test_defaults_and_no_lse(self):
        fw = self.fw
        case = make_case(np.random.default_rng(7), Tq=20, Tk=20)
        out = fw.api.flash_attention(*(fw.array(case[n]) for n in ("query", "key", "value")))
        assert_close(
            fw.numpy(out), attention_ref(case["query"], case["key"], case["value"])["out"], "float32"
        )

    # ---- bad input -------------------------------------------------------

    def test_bad_inputs(self):
        fw = self.fw
        rng = np.random.default_rng(8)
        q = fw.array(rng.standard_normal((1, 8, 4, 16)))
        k = fw.array(rng.standard_normal((1, 9, 2, 16)))
        v = fw.array(rng.standard_normal((1, 9, 2, 8)))
        fa = fw.api.flash_attention
        cases = [
            (TypeError, "query", dict(query=fw.array(np.zeros((1, 8, 4, 16)), "int32"))),
            (TypeError, "dtype", dict(key=fw.array(rng.standard_normal((1, 9, 2, 16)), "bfloat16"))),
            (ValueError, "query", dict(query=fw.array(np.zeros((8, 4, 16))))),
            (
                ValueError,
                "heads",
                dict(key=fw.array(np.zeros((1, 9, 3, 16))), value=fw.array(np.zeros((1, 9, 3, 8)))),
            ),
            (ValueError, "head_dim", dict(key=fw.array(np.zeros((1, 9, 2, 12))))),
            (ValueError, "value", dict(value=fw.array(np.zeros((1, 7, 2, 8))))),
            (
                ValueError,
                "head_dim",
                dict(query=fw.array(np.zeros((1, 8, 4, 300))), key=fw.array(np.zeros((1, 9, 2, 300)))),
            ),
            (ValueError, "batch", dict(key=fw.array(np.zeros((2, 9, 2, 16))))),
            (ValueError, "seq_len", dict(query=fw.array(np.zeros((1, 0, 4, 16))))),
            (TypeError, "causal", dict(causal="yes")),
            (TypeError, "sliding_window", dict(sliding_window=2.5)),
            (ValueError, "sliding_window", dict(sliding_window=-1)),
            (ValueError, "sliding_window", dict(sliding_window=(1, 2, 3))),
            (ValueError, "logits_soft_cap", dict(logits_soft_cap=0.0)),
            (TypeError, "logits_soft_cap", dict(logits_soft_cap="1")),
            (ValueError, "softmax_scale", dict(softmax_scale=float("inf"))),
            (TypeError, "return_lse", dict(return_lse=1)),
            (TypeError, "q_segment_ids", dict(q_segment_ids=fw.array(np.zeros((1, 8)), "float32"))),
            (ValueError, "kv_segment_ids", dict(kv_segment_ids=fw.array(np.zeros((1, 8)), "int32"))),
            (ValueError, "Tq == Tk", dict(q_segment_ids=fw.array(np.zeros((1, 8)), "int32"))),
            (ValueError, "q_positions", dict(q_positions=fw.array(np.zeros((2, 8)), "int32"))),
            (TypeError, "kv_positions", dict(kv_positions=fw.array(np.zeros(9), "float32"))),
            (ValueError, "softmax_aux", dict(softmax_aux=fw.array(np.zeros(3)))),
            (TypeError, "softmax_aux", dict(softmax_aux=fw.array(np.zeros(4), "int32"))),
            (ValueError, "bias", dict(bias=fw.array(np.zeros((1, 4, 8, 8))))),
            (ValueError, "bias", dict(bias=fw.array(np.zeros((1, 3, 8, 9))))),
            (TypeError, "bias", dict(bias=fw.array(np.zeros((1, 4, 8, 9)), "int32"))),
        ]
        for err, word, kwargs in cases:
            args = {"query": q, "key": k, "value": v, **kwargs}
            with pytest.raises(err, match=word):
                fa(**args)
