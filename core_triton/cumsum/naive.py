"""Float64 reference of the chunked cumsums, written plainly with loops
over time (numpy only): windowed running sums and their adjoint, for the
tests and the demo."""

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
