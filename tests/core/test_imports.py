"""core_triton imports no framework; each binding imports only its own."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules_after(stmt: str, *flags: str) -> set[str]:
    code = f"import sys; {stmt}; print(','.join(m for m in ('jax', 'torch') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, *flags, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        check=True,
    )
    return set(filter(None, out.stdout.strip().split(",")))


def test_core_imports_no_framework():
    assert _modules_after("import core_triton") == set()


def test_every_core_module_imports_no_framework():
    # Every module of every family folder (core_triton/common, cumsum,
    # linear_attn, attention), not only what the package re-exports.
    stmt = (
        "import importlib, pkgutil, core_triton; "
        "mods = pkgutil.walk_packages(core_triton.__path__, 'core_triton.'); "
        "[importlib.import_module(m.name) for m in mods]"
    )
    assert _modules_after(stmt) == set()


@pytest.mark.jax
def test_jax_api_does_not_import_torch():
    pytest.importorskip("jax")
    assert "torch" not in _modules_after("import jax_api")


def test_torch_api_does_not_import_jax():
    pytest.importorskip("torch")
    assert "jax" not in _modules_after("import torch_api")


def test_checks_survive_python_O():
    # Checks are no asserts: -O strips asserts but must not change errors.
    code = (
        "from core_triton import TensorInfo, chunk_local_cumsum as c\n"
        "try:\n c.plans(TensorInfo((1, 8, 2), 'float32', (16, 2, 1)), 3)\n"
        "except ValueError as e:\n print('ValueError', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-O", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        check=True,
    )
    assert out.stdout.startswith("ValueError chunk_size")
