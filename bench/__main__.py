"""``python -m bench [names...]``: run the benchmarks on a CUDA GPU and
write tables (JSON) and plots under bench-results/.  ``python -m bench ring
[--jax] [T_local]`` runs the ring benchmark over every visible GPU instead
(not in the default set: it needs two or more)."""

import os
import sys

# JAX would otherwise take 75% of the GPU's memory at start, leaving torch
# (which shares the GPU in the same process) too little.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


# What ``python -m bench`` runs, in order (``--list`` prints each with its
# docstring's first line); bench/probes/ holds one-off probes it never runs.
MODULES = (
    "cumsum",
    "linear_attention",
    "attention",
    "flash",
    "latency",
    "first_call",
    "varlen",
    "decode",
    "delta_rule",
    "long_context",
    "segments",
    "transformers_step",
)
USAGE = """usage: python -m bench [--list] [NAME ...]
       python -m bench ring [--jax] [T_local]

Runs the named benchmarks (default: all of them, in --list's order) on a
CUDA GPU and writes their tables (JSON) under $TWINKERNELS_BENCH_DIR
(bench-results/).  "ring" runs the ring benchmark over every visible GPU
(two or more; not in the default set)."""


def summaries() -> list[tuple[str, str]]:
    """``(name, what it measures)`` of each default benchmark module: its
    docstring's text up to the first colon or full stop."""
    import importlib
    import re

    out = []
    for name in MODULES:
        doc = " ".join((importlib.import_module(f"bench.{name}").__doc__ or "").split())
        out.append((name, re.split(r"[:.](?:\s|$)", doc, maxsplit=1)[0]))
    return out


def main(argv):
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return
    if argv[:1] == ["--list"]:
        for name, line in summaries():
            print(f"{name:18} {line}")
        return
    if argv[:1] == ["ring"]:
        # Several GPUs and its own processes (or a JAX Mesh): see bench/ring.py.
        from bench import ring

        ring.main(argv[1:])
        return
    unknown = [n for n in argv if n not in MODULES]
    if unknown:
        sys.exit(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(MODULES)} (or ring)")
    import importlib

    import torch

    if not torch.cuda.is_available():
        sys.exit("the benchmarks need a CUDA GPU (the interpreter would time Python, not kernels)")
    modules = {n: importlib.import_module(f"bench.{n}") for n in argv or MODULES}
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    total = sum(m.count() for m in modules.values())
    progress = tqdm(total=total, desc="bench", unit="case") if tqdm else None
    for m in modules.values():
        m.run(progress)
    if progress is not None:
        progress.close()


if __name__ == "__main__":
    main(sys.argv[1:])
