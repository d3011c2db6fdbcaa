"""``python -m bench [names...]``: run the benchmarks on a CUDA GPU and
write tables (JSON) and plots under bench-results/.  ``python -m bench ring
[--jax] [T_local]`` runs the ring benchmark over every visible GPU instead
(not in the default set: it needs two or more)."""

import os
import sys

# JAX would otherwise take 75% of the GPU's memory at start, leaving torch
# (which shares the GPU in the same process) too little.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def main(argv):
    if argv[:1] == ["ring"]:
        # Several GPUs and its own processes (or a JAX Mesh): see bench/ring.py.
        from bench import ring

        ring.main(argv[1:])
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("the benchmarks need a CUDA GPU (the interpreter would time Python, not kernels)")
    from bench import (
        attention,
        cumsum,
        decode,
        delta_rule,
        first_call,
        flash,
        latency,
        linear_attention,
        long_context,
        segments,
        transformers_step,
        varlen,
    )

    modules = {
        "cumsum": cumsum,
        "linear_attention": linear_attention,
        "attention": attention,
        "flash": flash,
        "latency": latency,
        "first_call": first_call,
        "varlen": varlen,
        "decode": decode,
        "delta_rule": delta_rule,
        "long_context": long_context,
        "segments": segments,
        "transformers_step": transformers_step,
    }
    names = argv or list(modules)
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    total = sum(modules[n].count() for n in names)
    progress = tqdm(total=total, desc="bench", unit="case") if tqdm else None
    for n in names:
        modules[n].run(progress)
    if progress is not None:
        progress.close()


if __name__ == "__main__":
    main(sys.argv[1:])
