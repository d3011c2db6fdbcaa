"""Timing and reporting helpers shared by the benchmark modules.

Every implementation is timed the same way, whatever its framework: a
warm-up, then ``iters`` back-to-back calls with one synchronisation at the
end, repeated ``reps`` times; we report the median time per call.  That
counts launch overhead alike for JAX (async dispatch) and PyTorch.
"""

from __future__ import annotations

import json
import os
import statistics
import time

RESULTS_DIR = os.environ.get("TWINKERNELS_BENCH_DIR", "bench-results")


def time_per_call(fn, sync, iters: int = 20, reps: int = 5, warmup: int = 3) -> float:
    """Median seconds per call of ``fn()``; ``sync(result)`` waits for it."""
    for _ in range(warmup):
        sync(fn())
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        out = None
        for _ in range(iters):
            out = fn()
        sync(out)
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples)


def copy_bandwidth(torch, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read plus written)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    t = time_per_call(lambda: dst.copy_(src), lambda _: torch.cuda.synchronize())
    return 2 * nbytes / t / 1e9


def save(name: str, rows: list[dict], meta: dict) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return path


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)
