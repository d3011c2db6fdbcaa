"""Compiled kernels and CPU arrays: a RuntimeError that says what to do."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TORCH = "import torch, torch_api; torch_api.chunk_global_cumsum(torch.randn(1, 8, 2))"
JAX = "import jax.numpy as jnp, jax_api; jax_api.chunk_global_cumsum(jnp.ones((1, 8, 2)))"


@pytest.mark.parametrize("framework,code", [("torch", TORCH), ("jax", JAX)])
def test_cpu_inputs_without_interpreter(framework, code):
    pytest.importorskip(framework)
    env = {**os.environ, "PYTHONPATH": ROOT, "TRITON_INTERPRET": "0", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode != 0
    assert "RuntimeError" in out.stderr and "TRITON_INTERPRET=1" in out.stderr, out.stderr[-2000:]
