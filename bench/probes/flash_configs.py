"""A tuning aid (not part of ``nox -s bench``): for each length, the configs
PyTorch's autotuner timed for ``flash_attention`` (forward, dK/dV, dQ) and
the ones it picked, and both bindings timed on those configs, so that a gap
between JAX and PyTorch can be told apart from a different autotuning
choice.  ``python -m bench.probes.flash_configs [T ...]``."""

from __future__ import annotations

import sys

from bench.attention import _flops, _make
from bench.common import time_per_call


def _time(name, T, causal, mode, mods):
    fn, sync, _ = _make(name, T, causal, mode, *mods)
    t = time_per_call(fn, sync, iters=5, reps=3, warmup=2)
    return f"{t * 1e3:.3f} ms {_flops(T, causal, mode) / t / 1e12:.0f} TFLOP/s"


def _timings(kernel):
    """The autotuner's last sweep as 'BMxBN/warps/stages: ms' lines, best first."""
    rows = sorted(getattr(kernel, "configs_timings", {}).items(), key=lambda kv: kv[1])
    lines = []
    for c, t in rows:
        ms = t[0] if isinstance(t, list) else t
        lines.append(f"  {c.kwargs['BM']}x{c.kwargs['BN']}/{c.num_warps}w/{c.num_stages}s: {ms:.3f} ms")
    return lines


def main(argv):
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api
    from core_triton.attention import flash as core
    from core_triton.attention import flash_configs

    measured_choice = core.measured_choice
    lengths = [int(a) for a in argv] or [8192]
    mods = (torch, jax, jnp, torch_api, jax_api)
    for causal in (False, True):
        for T in lengths:
            # Autotune head dim 128 too (this measures the choice), afresh at
            # this T; plans are cached, so flags only act on new ones.
            flash_configs.MEASURED, core.measured_choice = False, measured_choice
            core.attention_plans.cache_clear()
            for kind in ("fwd", "dkdv", "dq"):
                flash_configs.tuned_kernel(kind, 128, flash_configs.length_class(T)).cache.clear()
            for mode in ("fwd", "fwd+bwd"):
                for name in ("twinkernels torch", "twinkernels jax"):
                    took = _time(name, T, causal, mode, mods)
                    print(f"T={T} causal={causal} autotuned {name} {mode}: {took}", flush=True)
            picks = {}
            for kind in ("fwd", "dkdv", "dq"):
                best = flash_configs.tuned_kernel(kind, 128, flash_configs.length_class(T)).best_config
                picks[kind] = (best.kwargs["BM"], best.kwargs["BN"], best.num_warps, best.num_stages)
                print(f"T={T} causal={causal} torch autotuner, {kind}: picked {picks[kind]}", flush=True)
                print(
                    "\n".join(_timings(flash_configs.tuned_kernel(kind, 128, flash_configs.length_class(T)))),
                    flush=True,
                )
            # Both bindings on torch's picks, no autotuning.
            core.measured_choice = lambda kind, *_, picks=picks: picks[kind]
            core.attention_plans.cache_clear()
            for mode in ("fwd", "fwd+bwd"):
                for name in ("twinkernels torch", "twinkernels jax"):
                    took = _time(name, T, causal, mode, mods)
                    print(f"T={T} causal={causal} fixed {name} {mode}: {took}", flush=True)
    flash_configs.MEASURED, core.measured_choice = True, measured_choice
    core.attention_plans.cache_clear()


if __name__ == "__main__":
    main(sys.argv[1:])
