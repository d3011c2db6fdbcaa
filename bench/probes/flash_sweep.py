"""A tuning aid (not part of ``nox -s bench``): the autotuner's timing of
every candidate config of the flash kernels (forward, dK/dV, dQ) for one
head dim, per dtype, mask and shape, through the PyTorch binding.  What it
prints is what fixed choices in ``core_triton.attention.flash`` are read
from.  ``python -m bench.probes.flash_sweep [HEAD_DIM]`` (default 256)."""

from __future__ import annotations

import sys

from bench.probes.flash_configs import _timings

# (dtype, B, H, T): the test suite's sizes and a model's.  Float32 never
# autotunes (core_triton.attention.flash): nothing to sweep there.
SHAPES = [("bfloat16", 4, 16, 1024), ("bfloat16", 4, 16, 4096)]


def main(argv):
    import torch

    import torch_api
    from core_triton.attention import flash as core
    from core_triton.attention import flash_configs

    D = int(argv[0]) if argv else 256
    dim_class = flash_configs.dim_class(D)
    measured_choice = core.measured_choice
    core.measured_choice = lambda *args, **kw: None  # autotune every head dim
    try:
        for dtype, B, H, T in SHAPES:
            for causal in (False, True):
                core.attention_plans.cache_clear()
                for kind in ("fwd", "dkdv", "dq"):
                    flash_configs.tuned_kernel(kind, dim_class, flash_configs.length_class(T)).cache.clear()
                g = torch.Generator(device="cuda").manual_seed(0)
                dt = getattr(torch, dtype)
                q, k, v, do = (
                    torch.randn(B, T, H, D, device="cuda", dtype=dt, generator=g) for _ in range(4)
                )
                leaves = [x.requires_grad_() for x in (q, k, v)]
                try:
                    out = torch_api.flash_attention(*leaves, causal=causal)
                    torch.autograd.grad(out, leaves, do)
                    torch.cuda.synchronize()
                except Exception as e:  # a config that cannot run is what this reports
                    print(f"D={D} {dtype} B{B} H{H} T{T} causal={causal}: {type(e).__name__}: {e}")
                    continue
                for kind in ("fwd", "dkdv", "dq"):
                    print(f"D={D} {dtype} B{B} H{H} T{T} causal={causal} {kind}:", flush=True)
                    print(
                        "\n".join(
                            _timings(
                                flash_configs.tuned_kernel(kind, dim_class, flash_configs.length_class(T))
                            )
                        ),
                        flush=True,
                    )
                del q, k, v, do, leaves
                torch.cuda.empty_cache()
    finally:
        core.measured_choice = measured_choice
        core.attention_plans.cache_clear()


if __name__ == "__main__":
    main(sys.argv[1:])
