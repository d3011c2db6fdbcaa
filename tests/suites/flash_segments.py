"""``flash_attention`` with segment ids, written once for both bindings:
the ranges the kernels skip tiles by (core_triton.attention.segment_ranges)
against numpy, and the attention against the float64 reference, forward and
every gradient, for sorted and unsorted ids, one segment, many short ones,
an id in two separate runs, segments the keys lack, cross attention, with
causal masks and windows.

The interpreter runs 32x32 tiles: the cases' segments are longer and
shorter than a tile and start mid-tile, so every kind of run (skipped,
edge, inner) is crossed.  The GPU cases run the configs a GPU picks.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from core_triton.attention import segment_ranges
from core_triton.attention.naive import attention_ref
from core_triton.common.launch import TensorInfo
from core_triton.common.runtime import interpreter_requested
from core_triton.common.utils import contiguous_strides
from tests.reference import assert_close
from tests.suites.flash_attention import (
    FlashAttentionSuite,
    dkdv_splits_set,
    gluon_backward_set,
    gluon_forward_kernel,
    gluon_forward_runs,
    gluon_persistent_set,
    gluon_ranged_set,
    make_case,
    spy_launches,
    ws_forward_on,
)
from tests.suites.kernel_level import KernelLevelCases

# Gated pairs through the Gluon kernels: one segment, a batch row of one
# segment beside one of documents, whole rows beside rows that see nothing,
# and "long" (2200 tokens a row, one segment beside three documents).
GLUON_SEGMENT_CASES = [
    "one_segment_causal",
    "batch_rows_one_segment_and_docs",
    "cross_whole_rows_beside_empty",
    "long",
]


def sorted_ids(lengths, first=0, gaps=(1,)):
    """Non-decreasing ids, ``lengths[i]`` tokens of the i-th id; ids grow
    by the steps ``gaps`` (cycled), so they need not be consecutive."""
    ids, value = [], first
    for i, n in enumerate(lengths):
        ids += [value] * n
        value += gaps[i % len(gaps)]
    return np.array(ids, np.int32)


def _runs(pattern, T):
    """``pattern`` of (id, length) runs repeated to ``T`` tokens."""
    out = []
    while len(out) < T:
        for value, n in pattern:
            out += [value] * n
    return np.array(out[:T], np.int32)


def _ids(kind, rng, T):
    """One row of ids of the named kind."""
    if kind == "one":
        return np.full(T, 7, np.int32)
    if kind == "docs":  # longer and shorter than a tile, empty gaps in values
        return sorted_ids(_fit([70, 3, 45, 1, 12], T), first=-3, gaps=(1, 4))
    if kind == "short":  # every segment shorter than a tile
        return sorted_ids(_fit(list(rng.integers(1, 9, T)), T))
    if kind == "two_runs":  # id 0 in two separate runs
        return _runs([(0, 30), (1, 41), (0, 25), (2, 11)], T)
    if kind == "long_runs":
        return _runs([(5, 100), (3, 60), (5, 40), (9, 100)], T)
    if kind == "random":  # unsorted, every token its own draw
        return rng.integers(0, 3, T).astype(np.int32)
    if kind == "descending":  # sorted the other way: not "non-decreasing"
        return sorted_ids(_fit([40, 50, 60], T))[::-1].copy()
    raise ValueError(kind)


def _fit(lengths, T):
    """Lengths cut or extended (the last one) to sum to ``T``."""
    out, total = [], 0
    for n in lengths:
        n = min(int(n), T - total)
        if n <= 0:
            break
        out.append(n)
        total += n
    if total < T:
        out[-1] += T - total
    return out


# name -> (make_case arguments, query ids per batch row, key ids per batch
# row or None (one array for both), options)
CASES = {
    "one_segment_causal": ({"Tq": 130, "Tk": 130}, ["one"], None, {"causal": True}),
    "one_segment_full_gqa": ({"Tq": 100, "Tk": 100, "HQ": 4, "H": 1}, ["one"], None, {}),
    "docs_causal": ({"Tq": 150, "Tk": 150}, ["docs"], None, {"causal": True}),
    "docs_full_sink": ({"Tq": 131, "Tk": 131, "sink": "2d"}, ["docs"], None, {}),
    "docs_window_causal": (
        {"Tq": 150, "Tk": 150},
        ["docs"],
        None,
        {"causal": True, "sliding_window": (40, 0)},
    ),
    "docs_window_both_sides": ({"Tq": 131, "Tk": 131}, ["docs"], None, {"sliding_window": (33, 20)}),
    "short_segments_causal": ({"Tq": 110, "Tk": 110}, ["short"], None, {"causal": True}),
    "id_in_two_runs_causal": ({"Tq": 120, "Tk": 120}, ["two_runs"], None, {"causal": True}),
    # Unsorted, long enough that a program's bound (128 tokens) is narrower
    # than the row: the last tokens' segment lies in the last third only.
    "unsorted_long_runs_causal": ({"Tq": 300, "Tk": 300}, ["long_runs"], None, {"causal": True}),
    "unsorted_random_window": ({"Tq": 100, "Tk": 100}, ["random"], None, {"sliding_window": (25, 25)}),
    "descending_causal": ({"Tq": 150, "Tk": 150}, ["descending"], None, {"causal": True}),
    "batch_rows_sorted_and_not": (
        {"B": 2, "Tq": 130, "Tk": 130},
        ["docs", "two_runs"],
        None,
        {"causal": True},
    ),
    # Gated pairs (flash.gated_pair): a row in one segment (the kernel of
    # plain attention) beside a row of documents (the ranged kernel) in one
    # call; then, in one row, queries that see every key beside queries
    # that see none, so a block holds rows of both kinds (the ranged launch
    # writes the whole block again).
    "batch_rows_one_segment_and_docs": (
        {"B": 2, "Tq": 130, "Tk": 130},
        ["one", "docs"],
        None,
        {"causal": True},
    ),
    "cross_whole_rows_beside_empty": (
        {"Tq": 90, "Tk": 70},
        [sorted_ids([45, 45])],
        [sorted_ids([70])],
        {},
    ),
    "cap_bias_sink_docs": (
        {"Tq": 131, "Tk": 131, "sink": "1d", "bias": "1H"},
        ["docs"],
        None,
        {"causal": True, "logits_soft_cap": 2.0, "softmax_scale": 0.3},
    ),
    # Cross attention: the queries' and the keys' own ids.  Query segment 2
    # has no key (its rows see nothing) and key segment 4 no query; in the
    # next case query segments 2 and 8 have no key, key segment 5 no query.
    "cross_sorted_causal": (
        {"Tq": 75, "Tk": 140},
        [sorted_ids([20, 15, 40], first=1)],
        [sorted_ids([33, 50, 57], first=1, gaps=(2, 1))],
        {"causal": True},
    ),
    "cross_keys_lack_segments": (
        {"Tq": 96, "Tk": 70},
        [sorted_ids([10, 40, 46], first=1, gaps=(1, 6))],
        [sorted_ids([64, 6], first=1, gaps=(4,))],
        {},
    ),
    "cross_unsorted_keys": (
        {"Tq": 70, "Tk": 101},
        [sorted_ids([35, 35])],
        [_runs([(0, 20), (1, 37), (0, 13)], 101)],
        {"sliding_window": (60, 60)},
    ),
}


# Segment ids through the persistent Gluon forward alone (RANGED): every
# case with no window, soft cap, sinks or bias (what the kernel takes), and
# "long".
_NOT_RANGED = {"sink", "bias", "sliding_window", "logits_soft_cap", "softmax_scale"}
RANGED_CASES = [n for n, (shape, _, _, opts) in CASES.items() if not _NOT_RANGED & {*shape, *opts}] + ["long"]


def case_inputs(name, seed=0):
    """The case's inputs (make_case's, with its segment ids) and options."""
    shape, q_kinds, k_kinds, options = CASES[name]
    rng = np.random.default_rng(seed)
    c = make_case(rng, **{"HQ": 2, "H": 1, **shape})
    B, Tq, Tk = c["query"].shape[0], c["query"].shape[1], c["key"].shape[1]

    def rows(kinds, T):
        return np.stack(
            [k if isinstance(k, np.ndarray) else _ids(k, rng, T) for k in kinds * (B // len(kinds))]
        )

    c["q_segment_ids"] = rows(q_kinds, Tq)
    if k_kinds is not None:
        c["kv_segment_ids"] = rows(k_kinds, Tk)
    return c, options


def _function_name(kernel) -> str:
    """The Python function's name under a JITFunction (or an autotuner of
    one)."""
    while hasattr(kernel, "fn"):
        kernel = kernel.fn
    return getattr(kernel, "__name__", repr(kernel))


def ranges_ref(own, other, group=segment_ranges._BLOCK):
    """numpy ranges of each token of ``own [T]`` into ``other [T_other]``
    as core_triton.attention.segment_ranges writes them: ``[2T]``.  Sorted
    ``other``: each id's first and one-past-last index.  Else, per ``group``
    of consecutive tokens, a bound (start stored as ``-1 - start``): the
    span of ``other``'s tokens whose id lies between the group's smallest
    and largest ids, ``[0, 0)`` when none does."""
    T = len(own)
    if np.all(np.diff(other) >= 0):
        lo = np.searchsorted(other, own, side="left")
        hi = np.searchsorted(other, own, side="right")
        return np.concatenate([lo, hi]).astype(np.int32)
    lo, hi = np.zeros(T, np.int64), np.zeros(T, np.int64)
    for a in range(0, T, group):
        ids = own[a : a + group]
        hits = np.flatnonzero((other >= ids.min()) & (other <= ids.max()))
        lo[a : a + group] = -1 - (hits[0] if len(hits) else 0)
        hi[a : a + group] = hits[-1] + 1 if len(hits) else 0
    return np.concatenate([lo, hi]).astype(np.int32)


class FlashSegmentsSuite(KernelLevelCases):
    fw = None  # set by the framework's module
    _arrays = FlashAttentionSuite._arrays
    _check = FlashAttentionSuite._check

    def _launch(self, plan, inputs):
        return importlib.import_module(f"{self.fw.name}_api._launch").launch(plan, inputs)

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_ranges(self, name):
        """Each token's range of the other side's tokens of its segment:
        exact (a search) where the other side's row never decreases, else a
        bound shared by a program's tokens (ranges_ref).  int64 ids for the
        cross cases (read as int32, as the attention compares them)."""
        self._kernel_level(name == "batch_rows_sorted_and_not")
        dtype = "int64" if name.startswith("cross") else "int32"
        c, _ = case_inputs(name)
        q_ids = c["q_segment_ids"].astype(dtype)
        k_ids = c.get("kv_segment_ids", q_ids).astype(dtype)
        infos = [TensorInfo(a.shape, dtype, contiguous_strides(a.shape)) for a in (q_ids, k_ids)]
        plan = segment_ranges.range_plan(*infos, "q_segment_ids", "kv_segment_ids")
        fw = self.fw
        inputs = {"q_segment_ids": fw.array(q_ids, dtype), "kv_segment_ids": fw.array(k_ids, dtype)}
        q_range, k_range = (fw.numpy(a) for a in self._launch(plan, inputs))
        for b in range(q_ids.shape[0]):
            np.testing.assert_array_equal(q_range[b], ranges_ref(q_ids[b], k_ids[b]), f"q_key_range, row {b}")
            np.testing.assert_array_equal(
                k_range[b], ranges_ref(k_ids[b], q_ids[b]), f"kv_query_range, row {b}"
            )

    @pytest.mark.parametrize("order", ["sorted", "unsorted", "long_documents"])
    def test_ranges_long(self, order):
        """Rows of 5000 and 7000 ids (the search's several steps, several
        programs, a scan of several stretches): 400 documents, sorted or
        shuffled; or a few long documents, so that most programs hold one
        id (counted, not searched), with ids that only one side has (empty
        ranges before, between and after the other side's)."""
        self._kernel_level(order == "unsorted")
        rng = np.random.default_rng(9)
        q_ids = sorted_ids(_fit(list(rng.integers(1, 40, 400)), 5000))[None]
        k_ids = sorted_ids(_fit(list(rng.integers(1, 50, 400)), 7000))[None]
        if order == "unsorted":
            k_ids = k_ids[:, rng.permutation(7000)]
        if order == "long_documents":
            q_ids = np.repeat(np.array([0, 2, 3, 7, 9], np.int32), [1000, 1300, 200, 1500, 1000])[None]
            k_ids = np.repeat(np.array([-4, 2, 3, 5, 7], np.int32), [700, 2500, 129, 1671, 2000])[None]
        infos = [TensorInfo(a.shape, "int32", contiguous_strides(a.shape)) for a in (q_ids, k_ids)]
        plan = segment_ranges.range_plan(*infos, "q_segment_ids", "kv_segment_ids")
        fw = self.fw
        inputs = {"q_segment_ids": fw.array(q_ids, "int32"), "kv_segment_ids": fw.array(k_ids, "int32")}
        q_range, k_range = (fw.numpy(a) for a in self._launch(plan, inputs))
        np.testing.assert_array_equal(q_range[0], ranges_ref(q_ids[0], k_ids[0]), "q_key_range")
        np.testing.assert_array_equal(k_range[0], ranges_ref(k_ids[0], q_ids[0]), "kv_query_range")

    @pytest.mark.parametrize("name", sorted(CASES))
    def test_segments(self, name):
        c, options = case_inputs(name)
        self._kernel_level(name in ("docs_causal", "cross_unsorted_keys", "batch_rows_sorted_and_not"))
        self._check(c, options, dlse=name.startswith("docs"))

    @pytest.mark.parametrize("name", ["one_segment_causal", "cross_whole_rows_beside_empty"])
    def test_segments_ws_forward(self, name, monkeypatch):
        """The warp-specialised forward as a gated pair's first launch (the
        plan's pick on sm_90 at head dim 128 from 2048 tokens; forced on
        here, so the interpreter runs it with small blocks): it walks only
        the blocks with a row that sees every key, the ranged kernel the
        rest.  bf16, forward and every gradient against float64."""
        from core_triton.attention import flash_tma_plans

        # On a GPU the JAX binding launches it its own way (jax_api._compiled).
        self._kernel_level(not interpreter_requested())
        c, options = case_inputs(name)
        with ws_forward_on(self.fw, {c["query"].shape[3]: (128, 128, 4, 2)}):
            seen = spy_launches(self.fw, monkeypatch)
            self._check(c, options, dtype="bfloat16")
        first = next(p for p in seen if p.output_names == ("out", "lse"))
        assert first.kernel is flash_tma_plans.flash_fwd_ws_kernel and first.constexprs["GATE"] == 1, first

    @pytest.mark.parametrize(("kernel", "D"), [("persistent", 128), ("persistent", 64), ("tiled", 128)])
    @pytest.mark.parametrize("name", GLUON_SEGMENT_CASES)
    def test_segments_gluon_forward(self, name, kernel, D, monkeypatch):
        """The Gluon forward as a gated pair's first launch (the plan's pick
        on sm_90 from 1024 tokens; forced on here at every length), the
        persistent kernel (head dims 128 and 64; its producer hands the
        tiles it runs to the consumers) and the one of a program a tile:
        its blocks without a row that sees every key are skipped, the
        ranged kernel writes those rows; one segment, a batch row of one
        segment beside one of documents, whole rows beside rows that see
        nothing, and "long" (as test_segments_gluon_backward's: many tiles
        a program, some skipped).  bf16, forward and every gradient against
        float64."""
        if not gluon_forward_runs():
            pytest.skip("Gluon runs on an sm_90 GPU only")
        self._kernel_level(True)
        c, options = self._gluon_case(name, D)
        persistent = kernel == "persistent"
        fw = self.fw
        with ws_forward_on(fw, gluon="on"), gluon_persistent_set(fw, persistent), gluon_ranged_set(fw, False):
            seen = spy_launches(fw, monkeypatch)
            self._check(c, options, dtype="bfloat16")
        first = next(p for p in seen if p.output_names == ("out", "lse"))
        assert first.kernel is gluon_forward_kernel(persistent) and first.constexprs["GATE"] == 1, first

    @pytest.mark.parametrize("D", [128, 64])
    @pytest.mark.parametrize("name", RANGED_CASES)
    def test_segments_gluon_ranged(self, name, D, monkeypatch):
        """The persistent Gluon forward taking a call with segment ids alone
        (RANGED, opt-in: switched on here, the Gluon forward forced at every
        length): spans from the ranges, whole tiles on plain attention's
        code beside masked ones in one call, unmasked runs between masked
        blocks ("long"), ids compared only where a tile has a bound
        (unsorted rows), rows that see no key (output 0, ``lse = -inf``),
        cross attention, sorted and unsorted, one segment and many, head
        dims 128 and 64; int64 ids in the cross cases.  bf16, forward and
        every gradient against float64 (PyTorch's outputs start as NaN:
        every row must be written)."""
        if not gluon_forward_runs():
            pytest.skip("Gluon runs on an sm_90 GPU only")
        self._kernel_level(True)
        c, options = self._gluon_case(name, D)
        if name.startswith("cross"):
            c = {n: a.astype(np.int64) if n.endswith("segment_ids") else a for n, a in c.items()}
        fw = self.fw
        with ws_forward_on(fw, gluon="on"), gluon_persistent_set(fw, True), gluon_ranged_set(fw, True):
            seen = spy_launches(fw, monkeypatch)
            self._check(c, options, dtype="bfloat16")
        forward = [p for p in seen if p.output_names == ("out", "lse")]
        assert len(forward) == 1 and forward[0].kernel is gluon_forward_kernel(True), forward
        assert forward[0].constexprs["RANGED"] and forward[0].constexprs["GATE"] == 0, forward[0]

    @staticmethod
    def _gluon_case(name, D, seed=30):
        """A segments case at head dim ``D``; "long": 2200 tokens a row, one
        segment beside three documents, 4 query heads on 2, causal."""
        if name == "long":
            c = make_case(np.random.default_rng(34), B=2, Tq=2200, Tk=2200, HQ=4, H=2)
            c["q_segment_ids"] = np.stack([sorted_ids([2200]), sorted_ids([700, 900, 600])])
            options = {"causal": True}
        else:
            c, options = case_inputs(name)
        B, Tq, HQ, _ = c["query"].shape
        _, Tk, H, _ = c["key"].shape
        return {**c, **make_case(np.random.default_rng(seed), B=B, Tq=Tq, Tk=Tk, HQ=HQ, H=H, D=D)}, options

    @pytest.mark.parametrize("dlse", [False, True])
    @pytest.mark.parametrize("name", GLUON_SEGMENT_CASES)
    def test_segments_gluon_backward(self, name, dlse, monkeypatch):
        """The Gluon dQ and dK/dV as the first launches of the backward's
        gated pairs (the plan's pick on sm_90 at head dim 128 from 2048
        tokens where plain attention takes them; forced on here at every
        length): their blocks without a row (dQ) or key (dK/dV) that sees
        the whole other side return at once, the ranged kernels write the
        rest; with an ``lse`` cotangent the dQ pair is Triton's.  bf16, head
        dim 128, forward and every gradient against float64; "long": 2200
        tokens a row, one segment beside three documents, 4 query heads on
        2, causal."""
        if not gluon_forward_runs():
            pytest.skip("Gluon runs on an sm_90 GPU only")
        self._kernel_level(True)
        c, options = self._gluon_case(name, 128, seed=33)
        # One program a key block's query heads: a pair's Gluon dK/dV does not
        # split them, so the Triton dK/dV must not either (these small grids
        # would split by the plan's rule, and the Triton pairs run then).
        fw = self.fw
        with ws_forward_on(fw, gluon="on"), gluon_backward_set(fw, "on"), dkdv_splits_set(fw, 1):
            seen = spy_launches(fw, monkeypatch)
            self._check(c, options, dtype="bfloat16", dlse=dlse)
        gates = {_function_name(p.kernel): p.constexprs.get("GATE") for p in seen}  # each kernel's last
        assert gates.get("flash_bwd_dkdv_gluon_kernel") == 1, gates
        assert gates.get("flash_bwd_dq_gluon_kernel") == (None if dlse else 1), gates
        assert gates.get("flash_bwd_dq_kernel") == gates.get("flash_bwd_dkdv_kernel") == 2, gates  # ranged

    @pytest.mark.parametrize("kernel", ["ws", "gluon", "gluon_persistent"])
    def test_gate_skips_blocks(self, kernel):
        """A gated pair's first launch alone (GATE 1, outputs poisoned with
        NaN), the warp-specialised forward or a Gluon one: a block with no
        query that sees every key is left as it was (the ranged launch
        writes it), a block of such queries holds plain attention's rows.
        Batch 0's first 128 queries and batch 1's last are whole (key ids
        all 1, those queries' ids 1), the others' segment has no key.  bf16,
        head dim 128, against float64."""
        from core_triton.attention import flash, flash_tma_plans

        if kernel != "ws" and not gluon_forward_runs():
            pytest.skip("Gluon runs on an sm_90 GPU only")
        if self.fw.name == "jax" and not interpreter_requested():
            # The interpreter's JAX launch fills outputs from NaN tensors
            # (TWINKERNELS_POISON); on a GPU XLA allocates them, uninitialised.
            pytest.skip("JAX's GPU outputs cannot be poisoned: the PyTorch binding runs it")
        self._kernel_level()
        fw = self.fw
        B, T = 2, 256
        c = make_case(np.random.default_rng(31), B=B, Tq=T, Tk=T, HQ=2, H=1, D=128)
        q_ids, k_ids = np.ones((B, T), np.int32), np.ones((B, T), np.int32)
        q_ids[0, 128:] = 2
        q_ids[1, :128] = 2
        id_infos = [TensorInfo(a.shape, "int32", contiguous_strides(a.shape)) for a in (q_ids, k_ids)]
        ids = {"q_segment_ids": fw.array(q_ids, "int32"), "kv_segment_ids": fw.array(k_ids, "int32")}
        ranges = self._launch(segment_ranges.range_plan(*id_infos, *ids), ids)
        arrays = {n: fw.array(c[n], "bfloat16") for n in ("query", "key", "value")}
        infos = [TensorInfo(c[n].shape, "bfloat16", contiguous_strides(c[n].shape)) for n in arrays]
        r_infos = [TensorInfo(tuple(r.shape), "int32", contiguous_strides(tuple(r.shape))) for r in ranges]
        persistent = kernel == "gluon_persistent"
        with (
            ws_forward_on(fw, gluon="off" if kernel == "ws" else "on"),
            gluon_persistent_set(fw, persistent),
            gluon_ranged_set(fw, False),
        ):
            plans, _ = flash.plans(*infos, *id_infos, q_key_range=r_infos[0], kv_query_range=r_infos[1])
        first = plans.forward[0]
        want = flash_tma_plans.flash_fwd_ws_kernel if kernel == "ws" else gluon_forward_kernel(persistent)
        assert first.kernel is want and first.constexprs["GATE"] == 1, first
        q, k, v = arrays.values()
        out, _ = (
            fw.numpy(a) for a in self._launch(first, {"q": q, "k": k, "v": v, "q_key_range": ranges[0]})
        )
        seen = {n: fw.numpy(a) for n, a in arrays.items()}
        ref = attention_ref(**seen)["out"]
        for b, (whole, skipped) in enumerate(
            ((slice(0, 128), slice(128, T)), (slice(128, T), slice(0, 128)))
        ):
            assert np.isnan(out[b, skipped]).all(), f"batch {b}: a block without whole rows was written"
            assert_close(out[b, whole], ref[b, whole], "bfloat16", f"batch {b}, whole rows")

    @pytest.mark.parametrize("name", ["batch_rows_one_segment_and_docs", "cross_whole_rows_beside_empty"])
    def test_gated_pair_with_own_tiles(self, name, monkeypatch):
        """A gated pair whose two launches take different tiles (a GPU's
        measured tiles for head dim 64 differ between plain attention and
        the ranged kernel; forced here, so the interpreter runs them): rows
        of both kinds, forward and every gradient against float64."""
        from core_triton.attention import flash

        plain = {"fwd": (16, 32, 4, 1), "dkdv": (32, 16, 4, 1), "dq": (16, 32, 4, 1)}
        ranged = {"fwd": (32, 16, 4, 1), "dkdv": (16, 32, 4, 1), "dq": (32, 16, 4, 1)}

        def forced(kind, dim_class, causal, Tq, Tk, is_ranged=False, splits=1, half=True, capped=True):
            return None if splits is None else (ranged if is_ranged else plain)[kind]

        self._kernel_level(name == "batch_rows_one_segment_and_docs")
        monkeypatch.setattr(flash, "measured_choice", forced)
        flash.replan()
        self.fw.clear_caches()
        try:
            seen = spy_launches(self.fw, monkeypatch)
            c, options = case_inputs(name)
            self._check(c, options)
        finally:
            monkeypatch.undo()
            flash.replan()
            self.fw.clear_caches()
        by_kind = {"out": "fwd", "dk": "dkdv", "dk_part": "dkdv", "dq": "dq"}
        gated = [p for p in seen if p.output_names[0] in by_kind and "GATE" in p.constexprs]
        assert {p.constexprs["GATE"] for p in gated} == {1, 2}
        for p in gated:
            tiles = (p.constexprs["BM"], p.constexprs["BN"], p.num_warps, p.num_stages)
            want = (plain if p.constexprs["GATE"] == 1 else ranged)[by_kind[p.output_names[0]]]
            assert tiles == want, (p.output_names, p.constexprs["GATE"])

    def test_bfloat16_docs(self):
        c, options = case_inputs("docs_window_causal")
        self._check(c, options, dtype="bfloat16")

    def test_one_segment_is_plain_attention(self):
        """Ids that put every token in one segment give the bits of plain
        attention: the same tiles, the same products (only the edge tiles
        compare ids, and every comparison holds)."""
        fw = self.fw
        # A GPU takes its measured tiles, the same for both calls.
        c, options = case_inputs("one_segment_causal", seed=3)
        c = {**c, **make_case(np.random.default_rng(3), Tq=130, Tk=130, HQ=2, H=1, D=128)}
        x = [fw.array(c[n], "bfloat16") for n in ("query", "key", "value")]
        plain = fw.api.flash_attention(*x, **options)
        ids = fw.array(c["q_segment_ids"], "int32")
        np.testing.assert_array_equal(
            fw.numpy(fw.api.flash_attention(*x, q_segment_ids=ids, **options)), fw.numpy(plain)
        )

    def test_sorted_ids_are_packed_input(self):
        """Sorted ids and the same documents as ``cu_seqlens`` run the same
        tiles with the same products: equal bits."""
        fw = self.fw
        c, options = case_inputs("docs_causal", seed=4)
        c = {**c, **make_case(np.random.default_rng(4), Tq=150, Tk=150, HQ=2, H=1, D=128)}
        x = [fw.array(c[n], "bfloat16") for n in ("query", "key", "value")]
        ids = c["q_segment_ids"][0]
        cu = np.concatenate([[0], np.flatnonzero(np.diff(ids)) + 1, [len(ids)]]).astype(np.int32)
        packed = fw.api.flash_attention(*x, cu_seqlens=fw.array(cu, "int32"), **options)
        by_ids = fw.api.flash_attention(*x, q_segment_ids=fw.array(ids[None], "int32"), **options)
        np.testing.assert_array_equal(fw.numpy(by_ids), fw.numpy(packed))

    @pytest.mark.skipif(interpreter_requested(), reason="GPU sizes: the configs a GPU picks at long T")
    @pytest.mark.parametrize("D", [64, 128])
    @pytest.mark.parametrize("kind", ["one", "docs4", "docs64", "two_runs", "whole_beside_empty"])
    def test_gpu_sizes(self, kind, D):
        """T = 2048 (causal, GQA 8 on 2), the configs the GPU picks, bf16,
        forward and every gradient against the float64 reference."""
        T = 2048
        rng = np.random.default_rng(8)
        c = make_case(rng, Tq=T, Tk=T, HQ=8, H=2, D=D)
        if kind == "one":
            ids = np.zeros(T, np.int32)
        elif kind == "two_runs":
            ids = _runs([(0, 700), (1, 900), (0, 448)], T)
        elif kind == "whole_beside_empty":
            # Queries 0..999 see every key, the rest none: blocks of both
            # kinds, and one that holds both (flash.gated_pair).
            ids = sorted_ids([1000, T - 1000])
            c["kv_segment_ids"] = np.zeros((1, T), np.int32)
        else:
            n = int(kind[4:])
            ids = sorted_ids(_fit(list(rng.integers(T // (2 * n), 3 * T // (2 * n), n)), T))
        c["q_segment_ids"] = ids[None]
        self._check(c, {"causal": True}, dtype="bfloat16")
