"""On a GPU: a new sequence length or number of packed sequences compiles
no kernel again (tests/core/test_runtime_sizes.py checks the plans on the
CPU; this counts real compilations).  Each framework's module gives
``compiled(kernel)``, the number of compiled variants of a kernel."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

from core_triton.common import reductions
from core_triton.common.runtime import interpreter_requested
from core_triton.cumsum import segment_cumsum
from core_triton.linear_attn import chunk_bwd_dqk as chunk_backward_dqk
from core_triton.linear_attn import chunk_bwd_dv, chunk_bwd_state, recurrent_bwd, recurrent_fwd, state_split
from core_triton.linear_attn import chunk_fwd_output as chunk_output
from core_triton.linear_attn import chunk_fwd_state as chunk_state
from tests.suites.chunk_linear_attn import state_split as split_settings

KERNELS = {
    "recurrent": [recurrent_fwd.recurrent_fwd_kernel, recurrent_bwd.recurrent_bwd_kernel,
                  reductions.reduce_partials_kernel, reductions.head_sum_kernel],
    # "chunk": the state passes split over the sequence (state_split.py);
    # "chunk_whole": not.
    "chunk": [chunk_state.chunk_fwd_state_segment_kernel, state_split.state_split_carry_kernel,
              chunk_output.chunk_fwd_output_kernel, chunk_bwd_state.chunk_bwd_state_segment_kernel,
              chunk_bwd_dv.chunk_bwd_dv_kernel, chunk_backward_dqk.chunk_bwd_dqk_kernel,
              segment_cumsum.segment_cumsum_kernel, reductions.head_sum_kernel],
    "chunk_whole": [chunk_state.chunk_fwd_state_kernel, chunk_output.chunk_fwd_output_kernel,
                    chunk_bwd_state.chunk_bwd_state_kernel, chunk_bwd_dv.chunk_bwd_dv_kernel,
                    chunk_backward_dqk.chunk_bwd_dqk_kernel],
    "global_cumsum": [segment_cumsum.segment_cumsum_kernel],
}  # fmt: skip


def _cu(rng, T, N):
    """N sequences of random lengths (some empty) that fill T tokens."""
    cuts = np.sort(rng.integers(0, T + 1, N - 1))
    return np.concatenate([[0], cuts, [T]]).astype(np.int32)


class CompileOnceSuite:
    fw = None

    def compiled(self, kernel) -> int:
        raise NotImplementedError

    def _run(self, op, T, N, seed, H=4, K=64, V=64):
        fw, rng = self.fw, np.random.default_rng(seed)
        cu = fw.array(_cu(rng, T, N), "int32")
        if op == "global_cumsum":
            x = {"s": fw.array(rng.standard_normal((1, T, H)))}
            fn = lambda s: (fw.api.chunk_global_cumsum(s, reverse=True, cu_seqlens=cu),)  # noqa: E731
            cots = (fw.array(rng.standard_normal((1, T, H))),)
        else:
            x = {
                "query": fw.array(rng.standard_normal((1, T, H, K)), "bfloat16"),
                "key": fw.array(rng.standard_normal((1, T, H, K)), "bfloat16"),
                "value": fw.array(rng.standard_normal((1, T, H, V)), "bfloat16"),
                "g_gamma": fw.array(-np.abs(rng.standard_normal(H)) * 0.1),
            }
            if op.startswith("chunk"):
                x["g"] = fw.array(-np.abs(rng.standard_normal((1, T, H))) * 0.1)
            api = fw.api.recurrent if op == "recurrent" else fw.api.chunk_linear_attn
            fn = lambda **kw: api(**kw, cu_seqlens=cu)  # noqa: E731
            cots = (fw.array(rng.standard_normal((1, T, H, V)), "bfloat16"),
                    fw.array(rng.standard_normal((N, H, K, V))))  # fmt: skip
        outs, grads = fw.vjp_many(fn, x, cots)
        for a in (*outs, *grads.values()):
            assert np.all(np.isfinite(fw.numpy(a)))

    @pytest.mark.parametrize("op", list(KERNELS))
    def test_new_lengths_compile_nothing(self, op):
        if interpreter_requested():
            pytest.skip("counts GPU compilations")
        # The chunk op's state passes split at every size (segments of 8
        # chunks), or never ("chunk_whole").
        split = {"chunk": 8, "chunk_whole": 0}.get(op)
        with contextlib.nullcontext() if split is None else split_settings(self.fw, split):
            self._run(op, 3000, 7, 0)
            before = {k: self.compiled(k) for k in KERNELS[op]}
            assert all(n >= 1 for n in before.values()), before
            for T, N in ((5001, 64), (8192, 500), (777, 2)):
                self._run(op, T, N, T)
            after = {k: self.compiled(k) for k in KERNELS[op]}
        assert after == before, {k.fn.__name__: (before[k], after[k]) for k in before}

    # Alone on the GPU (gpu_run.sh runs this group after the rest, one test
    # at a time), so that the first call's time is not other tests' load.
    @pytest.mark.xdist_group("gpu_memory")
    def test_g_gamma_on_up_to_2000_sequences_compiles_once(self, monkeypatch, tmp_path):
        # The case that once compiled for 14 minutes: recurrent with g_gamma
        # on packed documents, whose partial sums over N * value tiles were
        # unrolled into the kernel.  Head sizes no other test uses and an
        # empty Triton cache, so the first call really compiles.
        if interpreter_requested():
            pytest.skip("counts GPU compilations")
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
        sizes = dict(H=3, K=48, V=40)
        start = time.perf_counter()
        self._run("recurrent", 8000, 2000, 1, **sizes)
        first = time.perf_counter() - start
        counts = {k: self.compiled(k) for k in KERNELS["recurrent"]}
        for N in (1, 10, 500, 1999):
            self._run("recurrent", 8000, N, N, **sizes)
        assert {k: self.compiled(k) for k in KERNELS["recurrent"]} == counts
        assert first < 30, f"first call took {first:.1f} s"
