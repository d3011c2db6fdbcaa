"""Where a transformers training step's time goes (torch profiler): the
Llama 1B-shaped step of bench.transformers_step (B1 T4096, bf16), transformers'
``sdpa`` beside ours, one document and 4 packed ones.  For each case: the
step's wall time, the GPU's busy time (the sum of its kernels' times: less
than the wall time where the host does not keep the GPU fed), and the
kernels that take the most of it.  ``python -m bench.probes.step_profile``.
Offline probe (issue 28)."""

from __future__ import annotations

import collections
import time

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

from bench.transformers_step import _inputs, _model
from torch_api.integrations.transformers import register

CASES = (("sdpa", 1), ("twinkernels", 1), ("sdpa", 4), ("twinkernels", 4))
STEPS = 3
TOP = 10


def main():
    register()
    model = _model(torch, transformers)
    for impl, docs in CASES:
        ids, pos, _, _, _ = _inputs(torch, docs)
        model.set_attn_implementation(impl)

        def step(ids=ids, pos=pos):
            model.zero_grad(set_to_none=True)
            model(input_ids=ids, position_ids=pos, labels=ids).loss.backward()

        for _ in range(2):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / STEPS * 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        per_kernel = collections.defaultdict(lambda: [0.0, 0])
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                k = per_kernel[e.name[:90]]
                k[0] += e.device_time / 1e3 / STEPS
                k[1] += 1
        busy = sum(t for t, _ in per_kernel.values())
        print(f"== {impl} docs={docs}: wall {wall:.1f} ms a step, GPU busy {busy:.1f} ms", flush=True)
        for name, (t, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:TOP]:
            print(f"  {t:8.2f} ms  {n // STEPS:5d}x  {name}", flush=True)


if __name__ == "__main__":
    main()
