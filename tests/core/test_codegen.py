"""The flash kernels stay fast under jax-triton's specialisation.
jax-triton gives int arguments no divisibility-by-16 specialisation;
without the kernels' own stride hints (``DIV16``), K/V tile loads turn into
scalar 2-byte loads with no cp.async pipelining (seen on the H100: the JAX
binding's flash forward at about half of PyTorch's speed).  The JAX binding
now compiles the flash kernels through Triton's own binder (they take tuple
arguments: jax_api._compiled), as PyTorch does; this pins that the hints
alone keep them vectorised for a launcher that specialises as jax-triton
does.  Checked by compiling for sm_90 on the CPU (no GPU needed) in a
subprocess, since tests may run Triton in interpreter mode."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("causal", [False, True])
def test_jax_specialisation_keeps_vectorised_pipelined_loads(causal):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT
    args = [sys.executable, "-m", "tests.core.codegen_probe"] + (["causal"] if causal else [])
    res = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    counts = json.loads(res.stdout.strip().splitlines()[-1])
    for kind in ("fwd", "dkdv", "dq"):
        torch_, jax_ = counts[f"{kind}/torch"], counts[f"{kind}/jax"]
        assert torch_["cp_async"] > 0, (kind, counts)
        assert jax_ == torch_, (kind, counts)
        assert jax_["scalar_b16_loads"] == 0, (kind, counts)
