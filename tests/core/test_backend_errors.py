"""Compiled kernels and CPU arrays: a RuntimeError that says what to do."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TORCH = "import torch, torch_api; torch_api.chunk_global_cumsum(torch.randn(1, 8, 2))"
JAX = "import jax.numpy as jnp, jax_api; jax_api.chunk_global_cumsum(jnp.ones((1, 8, 2)))"


@pytest.mark.parametrize(
    "framework,code", [("torch", TORCH), pytest.param("jax", JAX, marks=pytest.mark.jax)]
)
def test_cpu_inputs_without_interpreter(framework, code):
    pytest.importorskip(framework)
    env = {**os.environ, "PYTHONPATH": ROOT, "TRITON_INTERPRET": "0", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode != 0
    assert "RuntimeError" in out.stderr and "TRITON_INTERPRET=1" in out.stderr, out.stderr[-2000:]


@pytest.mark.jax
def test_jax_on_cpu_without_torch_names_the_extra():
    # torch made unimportable in the child: the error comes at trace time,
    # names the extra, and is no JaxRuntimeError from inside a callback.
    pytest.importorskip("jax")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import jax.numpy as jnp, jax_api\n"
        "jax_api.chunk_global_cumsum(jnp.asarray([[[0.5, -1.0], [2.0, 0.25]]]))"
    )
    env = {**os.environ, "PYTHONPATH": ROOT, "TRITON_INTERPRET": "1", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode != 0
    assert "ModuleNotFoundError: The JAX binding" in out.stderr, out.stderr[-2000:]
    assert "'interpret' extra" in out.stderr
    assert "JaxRuntimeError" not in out.stderr and "callback" not in out.stderr


@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.jax)])
def test_non_array_argument_is_named(framework):
    pytest.importorskip(framework)
    api = __import__(f"{framework}_api")
    make = (lambda x: __import__("torch").tensor(x)) if framework == "torch" else __import__("numpy").asarray
    q = make([[[[0.5, 1.0]]]])
    with pytest.raises(TypeError, match="^query must be"):
        api.recurrent([[[[0.5, 1.0]]]], q, q)
    with pytest.raises(TypeError, match="^g must be"):
        api.chunk_local_cumsum([[[0.5]]], 16)
    with pytest.raises(TypeError, match="^cu_seqlens must be"):
        api.prepare_lens([0, 3])
