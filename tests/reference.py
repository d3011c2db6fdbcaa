"""How the tests compare with the float64 references (core_triton/<op
family>/naive.py): an rms error ratio and the tolerance of each dtype."""

from __future__ import annotations

import numpy as np


def rms_ratio(out, ref) -> float:
    """rms(out - ref) / rms(ref): an error measure robust to scale."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    denom = np.sqrt(np.mean(ref**2)) if ref.size else 1.0
    return float(np.sqrt(np.mean((out - ref) ** 2)) / max(denom, 1e-30)) if ref.size else 0.0


TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def assert_close(out, ref, dtype: str, what: str = "", scale=None) -> None:
    """rms(out - ref) / rms(scale) within the dtype's tolerance; ``scale``
    defaults to ``ref``.  A reduction whose terms cancel passes the size of
    the terms (its condition), since no float32 order of summation can
    beat that."""
    out = np.asarray(out, np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    assert np.all(np.isfinite(out)), f"{what}: non-finite values (unwritten output?)"
    if scale is None:
        err = rms_ratio(out, ref)
    else:
        err = float(np.sqrt(np.mean((out - ref) ** 2)) / max(np.sqrt(np.mean(np.square(scale))), 1e-30))
    assert err <= TOLERANCE[dtype], f"{what}: rms error ratio {err:.2e} > {TOLERANCE[dtype]:.0e}"
