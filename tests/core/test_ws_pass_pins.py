"""Pinned: what Triton's Hopper warp-specialisation pass does with the
shapes of a causal flash loop that core_triton.attention.flash_fwd_ws does
not use (issue 31), compiled for sm_90 on the CPU (tests/core/
ws_pass_probe.py, in a subprocess: tests may run Triton in interpreter
mode, and a failed pass may abort the process).

The shipped shape masks every key block inside one loop; an unmasked loop
followed by a second loop for the diagonal blocks, or by one masked block,
would skip the mask on all but the diagonal, but the pass fails on both
(``NVGPUWarpSpecialization``: Triton 3.6, the GPU machines', and 3.9,
CI's).  When an upgrade compiles them, these tests fail with a note to
measure that shape in flash_fwd_ws."""

import json
import os
import subprocess
import sys

import pytest

from tests.core.ws_pass_probe import SHAPES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _compile(shape):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT
    return subprocess.run(
        [sys.executable, "-m", "tests.core.ws_pass_probe", shape],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_one_masked_loop_is_warp_specialised():
    """The shipped shape: the pass adds 8 warps to the 4 launched and moves
    registers between them."""
    res = _compile(SHAPES[0])
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["num_warps"] == 12 and result["setmaxnreg"] > 0, result


@pytest.mark.parametrize("shape", SHAPES[1:])
def test_unmasked_loop_then_diagonal_fails_the_pass(shape):
    res = _compile(shape)
    if res.returncode == 0:
        pytest.fail(
            f"Triton's warp-specialisation pass now takes {shape!r} ({res.stdout.strip()}): "
            "measure it in core_triton.attention.flash_fwd_ws (the unmasked blocks would skip the mask)"
        )
    assert "NVGPUWarpSpecialization" in res.stderr, res.stderr[-3000:]
