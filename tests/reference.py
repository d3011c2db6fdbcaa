"""Float64 references, written plainly with loops over time (numpy only)."""

from __future__ import annotations

import numpy as np


def to_time_first(x: np.ndarray, head_first: bool) -> np.ndarray:
    """[B, H, T(, S)] -> [B, T, H(, S)] when head_first."""
    return np.swapaxes(x, 1, 2) if head_first else x


def windows(batch: int, seq_len: int, cu_seqlens, chunk_size):
    """(batch row, start, end) of every summation window; chunk_size=None
    gives one window per sequence."""
    if cu_seqlens is None:
        bounds = [(b, 0, seq_len) for b in range(batch)]
    else:
        cu = [int(c) for c in cu_seqlens]
        bounds = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    for b, bos, eos in bounds:
        if chunk_size is None:
            yield b, bos, eos
        else:
            for start in range(bos, eos, chunk_size):
                yield b, start, min(start + chunk_size, eos)


def cumsum_ref(x, chunk_size, reverse, scale, cu_seqlens, head_first):
    """Windowed inclusive running sums of x (float64), scaled."""
    xt = to_time_first(np.asarray(x, np.float64), head_first)
    out = np.full_like(xt, np.nan)
    for b, start, end in windows(xt.shape[0], xt.shape[1], cu_seqlens, chunk_size):
        for t in range(start, end):
            lo, hi = (t, end) if reverse else (start, t + 1)
            out[b, t] = xt[b, lo:hi].sum(axis=0)
    out = out * (1.0 if scale is None else scale)
    return to_time_first(out, head_first)


def cumsum_vjp_ref(dy, chunk_size, reverse, scale, cu_seqlens, head_first):
    """Adjoint of cumsum_ref: every output t spreads its cotangent onto the
    inputs that its sum read."""
    dyt = to_time_first(np.asarray(dy, np.float64), head_first)
    dx = np.zeros_like(dyt)
    for b, start, end in windows(dyt.shape[0], dyt.shape[1], cu_seqlens, chunk_size):
        for t in range(start, end):
            lo, hi = (t, end) if reverse else (start, t + 1)
            dx[b, lo:hi] += dyt[b, t]
    dx = dx * (1.0 if scale is None else scale)
    return to_time_first(dx, head_first)


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
