"""``flash_attention`` on packed input (``cu_seqlens``, ``cu_seqlens_k``),
written once for both bindings: against a float64 reference computed
sequence by sequence (each sequence's slice attended alone, its queries
at positions ``len_k - len_q + t``), forward and every gradient; tokens no
sequence covers have output 0 and gradient 0."""

from __future__ import annotations

import numpy as np
import pytest

from core_triton.attention.naive import attention_ref
from core_triton.common.runtime import interpreter_requested
from tests.reference import assert_close
from tests.suites.flash_attention import spy_launches, vjp

# name: (query lengths, key lengths or None (shared), Tq, Tk, heads (HQ, H),
# D, options, extras ("sink", "bias"))
CASES = {
    "self_causal_gqa_empty": ([0, 7, 1, 20, 13], None, 41, 41, (4, 2), 16, {"causal": True}, ()),
    "self_full_uncovered_tail": ([12, 25], None, 45, 45, (2, 1), 16, {}, ()),
    "cross_causal_sink": ([3, 0, 10, 5], [9, 4, 10, 20], 20, 45, (2, 2), 16, {"causal": True}, ("sink",)),
    "cross_kv_shorter": ([9, 12], [4, 30], 21, 34, (2, 1), 16, {"causal": True}, ()),
    "self_window_cap_scale": (
        [15, 30], None, 45, 45, (2, 1), 32,
        {"sliding_window": (4, 0), "logits_soft_cap": 5.0, "softmax_scale": 0.2}, (),
    ),
    "self_bias_window_both_sides": (
        [20, 25], None, 45, 45, (2, 2), 16, {"sliding_window": (6, 3)}, ("bias",),
    ),
}  # fmt: skip


def _cu(lengths, start=0):
    return np.concatenate([[start], start + np.cumsum(lengths)]).astype(np.int32)


def _reference(c, cu_q, cu_k, options, do):
    """Each sequence alone; zeros where no sequence covers a token."""
    q, k, v = c["query"], c["key"], c["value"]
    _, Tq, HQ, _ = q.shape
    out = np.zeros((1, Tq, HQ, v.shape[3]))
    lse = np.full((1, HQ, Tq), -np.inf)
    grads = {"dq": np.zeros_like(q), "dk": np.zeros_like(k), "dv": np.zeros_like(v)}
    if "softmax_aux" in c:
        grads["dsink"] = np.zeros_like(c["softmax_aux"])
        sinks = np.atleast_2d(c["softmax_aux"].reshape(HQ, -1))
        lse[:] = np.logaddexp.reduce(sinks, axis=1)[None, :, None]
    if "bias" in c:
        grads["dbias"] = np.zeros_like(c["bias"])
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        extra = {}
        if "softmax_aux" in c:
            extra["softmax_aux"] = c["softmax_aux"]
        if "bias" in c:
            extra["bias"] = c["bias"][:, :, q0:q1, k0:k1]
        r = attention_ref(
            q[:, q0:q1], k[:, k0:k1], v[:, k0:k1], **extra, **options,
            q_positions=np.arange(lq)[None] + (lk - lq), kv_positions=np.arange(lk)[None], do=do[:, q0:q1],
        )  # fmt: skip
        out[:, q0:q1], lse[:, :, q0:q1] = r["out"], r["lse"]
        grads["dq"][:, q0:q1] = r["dq"]
        grads["dk"][:, k0:k1] += r["dk"]
        grads["dv"][:, k0:k1] += r["dv"]
        if "softmax_aux" in c:
            grads["dsink"] += r["dsink"]
        if "bias" in c:
            grads["dbias"][:, :, q0:q1, k0:k1] = r["dbias"]
    return out, lse, grads


class FlashPackedSuite:
    fw = None  # set by the framework's module

    def _run(self, name, dtype="float32", start=0, cu_dtype="int32", seed=0):
        lq, lk, Tq, Tk, (HQ, H), D, options, extras = CASES[name]
        fw = self.fw
        rng = np.random.default_rng(seed)
        c = {
            "query": rng.standard_normal((1, Tq, HQ, D)),
            "key": rng.standard_normal((1, Tk, H, D)),
            "value": rng.standard_normal((1, Tk, H, D)),
        }
        if "sink" in extras:
            c["softmax_aux"] = rng.standard_normal(HQ)
        if "bias" in extras:
            c["bias"] = rng.standard_normal((1, HQ, Tq, Tk))
        cu_q = _cu(lq, start)
        cu_k = cu_q if lk is None else _cu(lk, start)
        packed = {"cu_seqlens": fw.array(cu_q, cu_dtype)}
        if lk is not None:
            packed["cu_seqlens_k"] = fw.array(cu_k, cu_dtype)
        arrays = {
            n: fw.array(a, dtype if n in ("query", "key", "value") else "float32") for n, a in c.items()
        }
        do = rng.standard_normal((1, Tq, HQ, D))

        def fn(**d):
            return (fw.api.flash_attention(**d, **packed, **options),)

        (out,), grads = vjp(fw, fn, arrays, (fw.array(do, dtype),))
        seen = {n: fw.numpy(a) for n, a in arrays.items()}
        ref_out, _, ref = _reference(seen, cu_q, cu_k, options, fw.numpy(fw.array(do, dtype)))
        assert_close(fw.numpy(out), ref_out, dtype, "output")
        covered = np.zeros(Tq, bool)
        covered[cu_q[0] : cu_q[-1]] = True
        assert np.all(fw.numpy(out)[:, ~covered] == 0), "uncovered queries must give 0"
        names = {"query": "dq", "key": "dk", "value": "dv", "softmax_aux": "dsink", "bias": "dbias"}
        for n, g in grads.items():
            gdt = dtype if n in ("query", "key", "value") else "float32"
            assert_close(fw.numpy(g), ref[names[n]], gdt, f"gradient of {n}")
        return fw.numpy(out)

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_packed(self, name):
        self._run(name)

    def test_packed_loops_visit_their_own_sequences_only(self, monkeypatch):
        """The attention launches read each block's range of the other
        side's tokens (cost follows the sum of len^2, not T^2): the ranged
        kernel's loops, or the gate of plain attention's kernel, which runs
        only the blocks whose rows see every token (flash.gated_pair)."""
        self.fw.clear_caches()  # JAX: trace again, so that the spy sees the launches
        seen = spy_launches(self.fw, monkeypatch)
        self._run("self_causal_gqa_empty")
        attention = [p for p in seen if "HAS_RANGE" in p.constexprs]
        # dK/dV writes split partials where its query-head group is split.
        kind = lambda p: {("dk_part", "dv_part"): ("dk", "dv")}.get(p.output_names, p.output_names)  # noqa: E731
        assert {kind(p) for p in attention} >= {("out", "lse"), ("dk", "dv"), ("dq", "delta")}
        ranged = {kind(p) for p in attention if p.constexprs["HAS_RANGE"]}
        assert ranged == {("out", "lse"), ("dk", "dv"), ("dq", "delta")}, ranged
        for plan in attention:
            assert plan.constexprs["HAS_RANGE"] or plan.constexprs["GATE"] == 1, plan.output_names
            names = {p.name for p in plan.params if hasattr(p, "name")}
            assert {"q_key_range", "kv_query_range"} <= names

    def test_packed_bfloat16_int64_boundaries(self):
        self._run("self_causal_gqa_empty", dtype="bfloat16", cu_dtype="int64", seed=1)

    def test_packed_boundaries_not_starting_at_zero(self):
        # Tokens 0-4 and past the last boundary belong to no sequence.
        self._run("self_full_uncovered_tail", start=5, seed=2)

    def test_packed_equals_segment_ids_with_aligned_positions(self):
        """The same attention written with segment ids and positions: equal
        outputs (the packed path is that attention)."""
        fw = self.fw
        rng = np.random.default_rng(3)
        lq, lk = [5, 0, 17, 9], [11, 3, 17, 2]
        cu_q, cu_k = _cu(lq), _cu(lk)
        Tq, Tk = int(cu_q[-1]), int(cu_k[-1])
        q, k, v = (rng.standard_normal(s) for s in ((1, Tq, 2, 16), (1, Tk, 1, 16), (1, Tk, 1, 16)))
        seg_q = np.repeat(np.arange(4), lq)[None].astype(np.int32)
        seg_k = np.repeat(np.arange(4), lk)[None].astype(np.int32)
        pos_q = np.concatenate([np.arange(a) + b - a for a, b in zip(lq, lk, strict=True)])
        pos_q = pos_q[None].astype(np.int32)
        pos_k = np.concatenate([np.arange(b) for b in lk])[None].astype(np.int32)
        x = [fw.array(a, "float32") for a in (q, k, v)]
        packed = fw.api.flash_attention(
            *x, causal=True, cu_seqlens=fw.array(cu_q, "int32"), cu_seqlens_k=fw.array(cu_k, "int32")
        )
        ids = {
            "q_segment_ids": fw.array(seg_q, "int32"),
            "kv_segment_ids": fw.array(seg_k, "int32"),
            "q_positions": fw.array(pos_q, "int32"),
            "kv_positions": fw.array(pos_k, "int32"),
        }
        written = fw.api.flash_attention(*x, causal=True, **ids)
        np.testing.assert_array_equal(fw.numpy(packed), fw.numpy(written))

    @pytest.mark.parametrize(
        "bad", [[0, 50, 20, 41], [-7, 3, 99, 41], [41, 0, 0, 0], [0, 2**31 - 1, -(2**31), 41]]
    )
    def test_packed_boundaries_that_break_the_contract_stay_in_bounds(self, bad):
        """Decreasing, negative or too large boundaries: the kernels clamp
        them (nothing is read or written outside the tensors), the output
        is finite and the padding-free rows are written."""
        fw = self.fw
        rng = np.random.default_rng(4)
        x = [fw.array(rng.standard_normal((1, 41, 2, 16)), "float32") for _ in range(3)]
        out = fw.api.flash_attention(*x, causal=True, cu_seqlens=fw.array(np.array(bad), "int32"))
        assert np.all(np.isfinite(fw.numpy(out)))

    @pytest.mark.parametrize(
        "kwargs, match",
        [
            ({"cu_seqlens_k": [0, 41]}, "cu_seqlens_k needs cu_seqlens"),
            ({"cu_seqlens": [[0, 41]]}, "cu_seqlens must be 1-D"),
            ({"cu_seqlens": [0, 20, 41], "cu_seqlens_k": [0, 41]}, "cu_seqlens_k must have the shape"),
            ({"cu_seqlens": [0, 41], "q_segment_ids": "seg"}, "q_segment_ids cannot be combined"),
        ],
    )
    def test_packed_argument_errors(self, kwargs, match):
        fw = self.fw
        rng = np.random.default_rng(5)
        x = [fw.array(rng.standard_normal((1, 41, 2, 16)), "float32") for _ in range(3)]
        args = {}
        for n, v in kwargs.items():
            args[n] = fw.array(np.zeros((1, 41)), "int32") if v == "seg" else fw.array(np.array(v), "int32")
        with pytest.raises(ValueError, match=match):
            fw.api.flash_attention(*x, **args)

    def test_packed_needs_batch_one(self):
        fw = self.fw
        x = [fw.array(np.random.default_rng(8).standard_normal((2, 8, 1, 16)), "float32") for _ in range(3)]
        with pytest.raises(ValueError, match="batch"):
            fw.api.flash_attention(*x, cu_seqlens=fw.array(np.array([0, 8]), "int32"))

    @pytest.mark.skipif(interpreter_requested(), reason="GPU sizes: the configs a GPU picks at long T, D=128")
    def test_packed_gpu_sizes(self):
        rng = np.random.default_rng(6)
        lengths = rng.integers(1, 700, 8)
        CASES["_gpu"] = (list(lengths), None, int(lengths.sum()) + 3, int(lengths.sum()) + 3, (4, 2), 128,
                         {"causal": True}, ())  # fmt: skip
        try:
            self._run("_gpu", dtype="bfloat16", seed=7)
        finally:
            del CASES["_gpu"]
