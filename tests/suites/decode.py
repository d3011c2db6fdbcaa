"""``decode_attention``, written once for both bindings: against a float64
reference that gathers each row's valid cache (through its pages) and
attends its new queries plainly, for every option, contiguous and paged
caches (pages in shuffled order), ``kv_lens`` of 0 and lengths shorter than
the number of new queries."""

from __future__ import annotations

import numpy as np
import pytest

from core_triton.attention.naive import attention_ref
from core_triton.common.runtime import interpreter_requested
from tests.reference import assert_close

# name: (B, Tq, HQ, H, D, Dv, capacity, page_size or None, kv_lens, options, sink)
CASES = {
    "contiguous_mha": (2, 1, 2, 2, 16, 16, 70, None, [70, 33], {}, None),
    "contiguous_gqa_tq4_causal": (3, 4, 8, 2, 32, 16, 50, None, [50, 2, 0], {}, None),
    "paged_shuffled_gqa": (2, 2, 4, 1, 16, 32, 96, 16, [90, 17], {}, None),
    "paged_odd_page_window": (2, 3, 4, 2, 16, 16, 60, 5, [58, 31], {"sliding_window": 7}, None),
    "cap_scale_sinks": (
        2, 2, 4, 2, 16, 16, 40, None, [40, 1], {"logits_soft_cap": 3.0, "softmax_scale": 0.3}, "2d",
    ),
    "paged_sinks_empty_row": (2, 1, 2, 1, 16, 16, 48, 16, [0, 48], {}, "1d"),
    # 72 slices in the interpreter: the combine merges two tiles of 64.
    "many_slices_sinks": (1, 2, 2, 1, 16, 16, 4600, None, [4590], {}, "2d"),
}  # fmt: skip


def make(rng, B, Tq, HQ, H, D, Dv, capacity, page, kv_lens, sink):
    """Inputs (float64) and the per-row caches ``[B][S_b, H, D]`` the reference reads."""
    x = {"query": rng.standard_normal((B, Tq, HQ, D))}
    kc = rng.standard_normal((B, capacity, H, D))
    vc = rng.standard_normal((B, capacity, H, Dv))
    if page is None:
        x["key_cache"], x["value_cache"] = kc, vc
    else:
        per_row = -(-capacity // page)
        n_blocks = B * per_row + 3  # spare pages nobody uses
        order = rng.permutation(n_blocks)[: B * per_row].reshape(B, per_row)
        kp = rng.standard_normal((n_blocks, page, H, D))
        vp = rng.standard_normal((n_blocks, page, H, Dv))
        for b in range(B):
            for j in range(per_row):
                rows = slice(j * page, min((j + 1) * page, capacity))
                n = rows.stop - rows.start
                kp[order[b, j], :n] = kc[b, rows]
                vp[order[b, j], :n] = vc[b, rows]
        x["key_cache"], x["value_cache"] = kp, vp
        x["block_table"] = order.astype(np.int32)
    x["kv_lens"] = np.asarray(kv_lens, np.int32)
    if sink == "1d":
        x["softmax_aux"] = rng.standard_normal(HQ)
    elif sink == "2d":
        x["softmax_aux"] = rng.standard_normal((HQ, 3))
    return x, kc, vc


def reference(q, kc, vc, kv_lens, options, sink):
    B, Tq, HQ, _ = q.shape
    out = np.zeros((B, Tq, HQ, vc.shape[-1]))
    for b in range(B):
        L = int(kv_lens[b])
        if L == 0:
            continue
        window = options.get("sliding_window")
        r = attention_ref(
            q[b : b + 1], kc[b : b + 1, :L], vc[b : b + 1, :L], softmax_aux=sink, causal=True,
            sliding_window=None if window is None else (window, None),
            logits_soft_cap=options.get("logits_soft_cap"), softmax_scale=options.get("softmax_scale"),
            q_positions=np.arange(Tq)[None] + L - Tq, kv_positions=np.arange(L)[None],
        )  # fmt: skip
        out[b] = r["out"][0]
    return out


class DecodeSuite:
    fw = None  # set by the framework's module

    def _run(self, name, dtype="float32", seed=0, case=None):
        B, Tq, HQ, H, D, Dv, capacity, page, kv_lens, options, sink = case or CASES[name]
        fw = self.fw
        x, kc, vc = make(np.random.default_rng(seed), B, Tq, HQ, H, D, Dv, capacity, page, kv_lens, sink)
        arrays = {
            n: fw.array(a, "int32" if a.dtype == np.int32 else (dtype if n != "softmax_aux" else "float32"))
            for n, a in x.items()
        }
        out = fw.api.decode_attention(**arrays, **options)
        assert str(out.dtype).split(".")[-1] == dtype
        # The reference reads the caches as the kernel saw them (rounded).
        rounded = {n: fw.numpy(fw.array(a, dtype)) for n, a in (("q", x["query"]), ("k", kc), ("v", vc))}
        want = reference(
            rounded["q"], rounded["k"], rounded["v"], x["kv_lens"], options, x.get("softmax_aux")
        )
        got = fw.numpy(out)
        assert_close(got, want, dtype, "output")
        for b, L in enumerate(kv_lens):
            for t in range(Tq):
                if L - Tq + t < 0:  # no key at or before this query's position
                    assert np.all(got[b, t] == 0)
        return got

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_decode(self, name):
        self._run(name)

    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    def test_decode_half_precision(self, dtype):
        self._run("paged_shuffled_gqa", dtype=dtype, seed=1)

    def test_kv_lens_past_the_cache_are_clamped(self):
        """Lengths beyond the capacity (or negative) stay inside the cache:
        a length past it reads as the full cache, a negative one as 0."""
        fw = self.fw
        case = (2, 1, 2, 1, 16, 16, 40, 8, [10**6, -5], {}, None)
        got = self._run(None, case=(*case[:8], [40, 0], *case[9:]))
        x, _, _ = make(np.random.default_rng(0), *case[:8], case[8], None)
        arrays = {n: fw.array(a, "int32" if a.dtype == np.int32 else "float32") for n, a in x.items()}
        np.testing.assert_array_equal(fw.numpy(fw.api.decode_attention(**arrays)), got)

    def test_page_indices_out_of_range_stay_in_bounds(self):
        fw = self.fw
        x, _, _ = make(np.random.default_rng(2), 2, 1, 2, 1, 16, 16, 32, 8, [32, 20], None)
        x["block_table"] = np.array([[0, -9, 10**6, 3], [2**31 - 1, 1, 0, 0]], np.int32)
        arrays = {n: fw.array(a, "int32" if a.dtype == np.int32 else "float32") for n, a in x.items()}
        assert np.all(np.isfinite(fw.numpy(fw.api.decode_attention(**arrays))))

    @pytest.mark.parametrize(
        "change, match",
        [
            ("tq17", "1 to 16 new tokens"),
            ("lens_float", "kv_lens must be int32"),
            ("heads", "multiple of the cache's heads"),
            ("table_rows", "block_table must be int32"),
        ],
    )
    def test_decode_argument_errors(self, change, match):
        fw = self.fw
        rng = np.random.default_rng(3)
        q = rng.standard_normal((2, 17 if change == "tq17" else 1, 3 if change == "heads" else 4, 16))
        k = rng.standard_normal((2, 24, 2, 16))
        args = {"query": fw.array(q), "key_cache": fw.array(k), "value_cache": fw.array(k)}
        args["kv_lens"] = fw.array(np.array([3, 4]), "float32" if change == "lens_float" else "int32")
        if change == "table_rows":
            args["block_table"] = fw.array(np.zeros((3, 2)), "int32")
        with pytest.raises((ValueError, TypeError), match=match):
            fw.api.decode_attention(**args)

    @pytest.mark.skipif(
        interpreter_requested(), reason="GPU sizes: long caches, D=128, the GPU's block sizes"
    )
    @pytest.mark.parametrize("page", [None, 64])
    def test_decode_gpu_sizes(self, page):
        rng = np.random.default_rng(4)
        lens = [int(v) for v in rng.integers(1, 6000, 3)]
        self._run(None, dtype="bfloat16", case=(3, 2, 32, 8, 128, 128, 6016, page, lens, {}, None))

    @pytest.mark.skipif(
        interpreter_requested(), reason="GPU sizes: long caches, D=128, the GPU's block sizes"
    )
    def test_decode_gpu_sizes_one_row_many_slices(self):
        # One row, one key head: 264 slices of the 70k cache, which the
        # combine merges in five tiles; sinks join them.
        self._run(None, dtype="bfloat16", case=(1, 1, 8, 1, 128, 128, 70000, None, [69990], {}, "1d"))

    @pytest.mark.skipif(
        interpreter_requested(), reason="GPU sizes: long caches, D=128, the GPU's block sizes"
    )
    @pytest.mark.parametrize("page", [None, 64])
    def test_decode_gpu_sizes_many_rows_one_slice(self, page):
        # 40 rows x 8 key heads fill the GPU: one slice each, the split
        # kernel writes the output itself (sinks in its normaliser).
        lens = [int(v) for v in np.random.default_rng(5).integers(0, 1500, 40)]
        self._run(None, dtype="bfloat16", case=(40, 2, 32, 8, 128, 128, 1536, page, lens, {}, "2d"))
