"""A tuning aid (not part of ``nox -s bench``): the autotuner's timing of
every candidate config of the flash kernels (forward, dK/dV, dQ) at the
Llama-1B attention shape (B1, 32 query heads on 4 KV heads, causal, bf16),
plain and with one segment of ids, so that a gap between the two (issue
32) can be told apart from a different autotuning pick.  With
``MAXNREG=N`` it times the forward and dQ configs again capped at ``N``
registers a thread (Triton's ``maxnreg``).
``python -m bench.probes.segment_sweep [HEAD_DIM [T ...]]`` (64, 4096)."""

from __future__ import annotations

import os
import sys

from bench.probes.flash_configs import _timings


def _sweep(torch, torch_api, core, flash_configs, D, T, names, label=""):
    dim_class = flash_configs.dim_class(D)
    for name in names:
        core.replan()  # new plan objects: no launch replays the old kernels
        for kind in ("fwd", "dkdv", "dq"):
            flash_configs.tuned_kernel(kind, dim_class, flash_configs.length_class(T)).cache.clear()
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(1, T, h, D, device="cuda", dtype=torch.bfloat16, generator=g) for h in (32, 4, 4)
        )
        ids = torch.zeros(1, T, dtype=torch.int32, device="cuda")
        kw = {} if name == "plain" else {"q_segment_ids": ids}
        leaves = [x.requires_grad_() for x in (q, k, v)]
        out = torch_api.flash_attention(*leaves, causal=True, **kw)
        torch.autograd.grad(out, leaves, torch.randn_like(out))
        torch.cuda.synchronize()
        for kind in ("fwd", "dkdv", "dq"):
            print(f"D={D} T{T} {name}{label} {kind}:", flush=True)
            print(
                "\n".join(
                    _timings(flash_configs.tuned_kernel(kind, dim_class, flash_configs.length_class(T)))
                ),
                flush=True,
            )


def main(argv):
    import torch

    import torch_api
    from core_triton.attention import flash as core
    from core_triton.attention import flash_configs

    D = int(argv[0]) if argv else 64
    lengths = [int(a) for a in argv[1:]] or [4096]
    core.measured_choice = lambda *args, **kw: None  # autotune every head dim
    for T in lengths:
        _sweep(torch, torch_api, core, flash_configs, D, T, ("plain", "one segment"))
    cap = int(os.environ.get("MAXNREG", "0"))
    if cap:
        for kind in ("fwd", "dq"):
            for T in lengths:
                for c in flash_configs.tuned_kernel(
                    kind, flash_configs.dim_class(D), flash_configs.length_class(T)
                ).configs:
                    c.maxnreg = cap
        for T in lengths:
            _sweep(torch, torch_api, core, flash_configs, D, T, ("one segment",), f" maxnreg {cap}")


if __name__ == "__main__":
    main(sys.argv[1:])
