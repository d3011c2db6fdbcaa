"""tests/core runs whole in the PyTorch session; the JAX session runs only
its tests that exercise the JAX binding, marked ``jax`` (noxfile.py:
``-m "jax or not core"``).  The rest is framework-free: plans, schedules,
imports, codegen and the PyTorch binding's parts, the same in both
sessions (CI time).  Here every test of this folder gets the ``core``
mark."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.core)
