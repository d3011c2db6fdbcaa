"""A profiling aid (not part of ``nox -s bench``): host time per call of a
small flash attention step under ``torch.compile``, ours beside SDPA, by
compile mode and by how the backward is asked for, with what Inductor
counted (CUDA-graph skips and re-recordings).  ``python -m
bench.probes.compiled_overhead``.
"""

from __future__ import annotations

import sys

from bench.probes.host_overhead import _rate

B, T, H, D = 2, 512, 8, 64


def _fns(torch, torch_api):
    def ours(q, k, v):
        return torch_api.flash_attention(q, k, v, causal=True)

    def sdpa(q, k, v):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)

    return {"ours": ours, "sdpa": sdpa}


def _steps(torch, f, mark, x, do):
    def fwd():
        mark()
        with torch.no_grad():
            return f(*x)

    def grad():
        mark()
        return torch.autograd.grad(f(*x), x, do)

    def backward():
        mark()
        f(*x).backward(do)

    return {"fwd (no_grad)": fwd, "fwd+autograd.grad": grad, "fwd+.backward": backward}


def main(argv):
    import torch
    from torch._dynamo.utils import counters

    import torch_api

    x = [torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
    for name, fn in _fns(torch, torch_api).items():
        for mode in ("eager", "default", "reduce-overhead"):
            torch._dynamo.reset()
            counters.clear()
            opts = {"mode": None if mode == "default" else mode, "fullgraph": True}
            f = fn if mode == "eager" else torch.compile(fn, **opts)
            mark = torch.compiler.cudagraph_mark_step_begin if mode == "reduce-overhead" else (lambda: None)
            for step_name, step in _steps(torch, f, mark, x, do).items():
                for _ in range(5):
                    step()
                host, wall = _rate(step, torch, n=100)
                us = f"host {host * 1e6:7.1f} us  wall {wall * 1e6:7.1f} us"
                print(f"{name:5s} {mode:16s} {step_name:18s} {us}")
            ind = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k or "skip" in k}
            print(f"      inductor counters: {ind}  stats: {dict(counters['stats'])}", flush=True)
            for x_ in x:
                x_.grad = None


if __name__ == "__main__":
    main(sys.argv[1:])
