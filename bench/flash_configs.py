"""A tuning aid (not part of ``nox -s bench``): the config the autotuner
picks for ``flash_attention`` from PyTorch, and both bindings timed on that
one config, so that a gap between JAX and PyTorch can be told apart from a
different autotuning choice.  ``python -m bench.flash_configs [T]``."""

from __future__ import annotations

import sys

from bench.attention import _flops, _make
from bench.common import time_per_call


def _time(name, T, causal, mode, mods):
    fn, sync, _ = _make(name, T, causal, mode, *mods)
    t = time_per_call(fn, sync, iters=5, reps=3, warmup=2)
    return f"{t * 1e3:.3f} ms {_flops(T, causal, mode) / t / 1e12:.0f} TFLOP/s"


def main(argv):
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api
    from core_triton import flash_attention as core

    T = int(argv[0]) if argv else 8192
    mods = (torch, jax, jnp, torch_api, jax_api)
    for causal in (False, True):
        core.AUTOTUNE = True
        for mode in ("fwd", "fwd+bwd"):
            for name in ("twinkernels torch", "twinkernels jax"):
                took = _time(name, T, causal, mode, mods)
                print(f"autotuned {name} causal={causal} {mode}: {took}", flush=True)
        for kind in ("fwd", "dkdv", "dq"):
            best = core._tuned(kind, 128).best_config
            print(f"torch autotuner picked for {kind} causal={causal}: {best}", flush=True)
        best = core._tuned("fwd", 128).best_config
        pick = (best.kwargs["BM"], best.kwargs["BN"], best.num_warps, best.num_stages)
        core.AUTOTUNE = False
        core._FIXED[128] = core._FWD_CONFIGS[128].index(pick)
        for mode in ("fwd",):
            for name in ("twinkernels torch", "twinkernels jax"):
                took = _time(name, T, causal, mode, mods)
                print(f"fixed {pick} {name} causal={causal} {mode}: {took}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
