"""``cu_seqlens`` that break the contract, traced (JAX) or unchecked
(PyTorch): no kernel touches memory outside its tensors, tokens outside
every sequence get 0, and the rest is what the valid call gives.  Each op
runs its cases in a process of its own (tests/packed_bounds.py says why and
what it checks)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from core_triton.common.runtime import interpreter_requested
from tests.packed_bounds import CASES, CLAMP_CASES, CLAMP_OPS, OPS
from tests.suites.kernel_level import KernelLevelCases

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# What a binding whose kernel_cases is False runs (tests/suites/kernel_level.py):
# the clamps are the kernels' (core_triton.common.sequences), the same for
# both bindings; these ops show that the binding hands bad values to them
# unchecked (JAX: traced) in each kind of op, sums and a recurrence with a
# state per sequence.
BINDING_OPS = ("local_cumsum", "global_cumsum", "delta_recurrent")


class PackedBoundsSuite(KernelLevelCases):
    fw = None  # set by the framework's module

    @pytest.mark.parametrize("op", [*OPS, *CLAMP_OPS])
    def test_bad_cu_seqlens_stay_in_bounds(self, op):
        self._kernel_level(op in BINDING_OPS)
        cases = CLAMP_CASES if op in CLAMP_OPS else list(CASES)
        if interpreter_requested():
            # CI time (these ran 7 minutes of CI's 2 cores): the cases that
            # reach every clamp between them (negative_and_huge: starts
            # below 0, ends past T; all_wild and decreasing: boundaries out
            # of order; first_not_zero: uncovered rows first).  The GPU runs
            # every case.
            keep = ("negative_and_huge", "all_wild", "decreasing", "first_not_zero")
            cases = [c for c in keep if c in cases][: 2 if op in CLAMP_OPS else 3]
        # Keep the caller's path (the GPU run's carried wheels live there).
        path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}
        args = [sys.executable, "-m", "tests.packed_bounds", self.fw.name, op, ",".join(cases)]
        res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
        passed = [line.split()[-1] for line in res.stdout.splitlines() if line.startswith("PASS")]
        assert res.returncode == 0 and passed == cases, (res.returncode, res.stdout, res.stderr[-4000:])
