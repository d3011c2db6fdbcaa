"""Checks the integration tests (tests/torch/test_transformers_attention.py,
tests/jax/test_flax_attention.py) share."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest

from tests.reference import assert_close


def assert_grads_close(got, ref, dtype: str, names, zero_below: float) -> None:
    """Each gradient of ``got`` against ``ref`` (same order, numpy arrays).

    A key projection's bias gets zero gradient in exact arithmetic (a
    softmax does not see a constant added to a row of logits); computed, it
    is rounding noise of terms of the gradients' size.  A reference gradient
    whose rms is below ``zero_below`` times the rms of all of them is
    measured against that overall rms instead of its own."""
    every = np.concatenate([np.ravel(g) for g in ref])
    overall = np.array([np.sqrt(np.mean(every**2))])
    for name, a, b in zip(names, got, ref, strict=True):
        zero = np.sqrt(np.mean(np.square(b))) < zero_below * overall[0]
        assert_close(np.asarray(a), np.asarray(b), dtype, f"grad {name}", scale=overall if zero else None)


def check_optional_dependency(monkeypatch, module: str, dependency: str, binding: str) -> None:
    """Without ``dependency`` importing ``module`` raises an ImportError
    saying what to install, and ``binding`` alone never imports it."""
    monkeypatch.setitem(sys.modules, dependency, None)
    monkeypatch.delitem(sys.modules, module)
    with pytest.raises(ImportError, match="pip install"):
        importlib.import_module(module)
    code = f"import sys, {binding}; assert {dependency!r} not in sys.modules, 'imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
