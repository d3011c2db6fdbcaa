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


def graph_time_per_call(torch, fn, calls: int = 10, iters: int = 10) -> float:
    """Median seconds per call of ``fn()`` replayed from one CUDA graph of
    ``calls`` back-to-back calls: the device time of a step as an inference
    server runs it (decoding steps are captured in graphs), without the
    host's launch cost, which back-to-back eager calls measure at small
    sizes."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return time_per_call(graph.replay, lambda _: torch.cuda.synchronize(), iters=iters, reps=5) / calls


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


def timed(fn, sync, budget: float = 0.25) -> float:
    """Median seconds per call: one warm-up call (compiles), then enough
    back-to-back calls to fill ``budget`` seconds, three times."""
    sync(fn())
    start = time.perf_counter()
    sync(fn())
    once = time.perf_counter() - start
    iters = max(1, min(50, int(budget / max(once, 1e-6))))
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        out = None
        for _ in range(iters):
            out = fn()
        sync(out)
        samples.append((time.perf_counter() - start) / iters)
    return statistics.median(samples)


def fla_ratios(rows: list[dict], case: tuple[str, ...]) -> None:
    """Add "vs fla" (fla's time / ours: > 1 where we are faster) to our rows
    and "jax/torch" (JAX time / PyTorch time) to the JAX binding's, pairing
    rows whose fields ``case`` agree; rows without a time (a refused
    baseline) get none."""
    by = {(*(r[f] for f in case), r["impl"]): r for r in rows}
    for r in rows:
        key = tuple(r[f] for f in case)
        fla = by.get((*key, "fla"))
        try:
            if r["impl"].startswith("twinkernels") and fla:
                r["vs fla"] = f"{float(fla['ms']) / float(r['ms']):.2f}x"
            if r["impl"] == "twinkernels jax":
                r["jax/torch"] = f"{float(r['ms']) / float(by[(*key, 'twinkernels torch')]['ms']):.2f}"
        except (ValueError, KeyError):
            pass
