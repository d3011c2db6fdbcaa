"""Which launch of a chunk_linear_attn call does not finish on the GPU
(``python -m bench.probes.launch_probe K CHUNK DTYPE REVERSE``).

The large-tile tests (tests/suites/chunk_linear_attn.py, head dims 128 and
256, chunks 128 and 256) have never finished on the H100: each ran past
350-410 s, although their kernels compile for sm_90 in under 10 s each and
the float64 reference takes 16 s on one thread, and while they ran every
other test on the machine slowed down: kernels that never end, or (more
likely) 16 workers each running torch on all 16 cores.
This runs one such case in the PyTorch binding with every launch printed
(kernel, grid, tiles) and waited for, so the last line printed before a
timeout names the launch that hangs; then it times the test's float64
reference (the other suspect: CPU contention between test workers).  gpu_run.sh PART=probe runs the
failing cases, each in its own process under a timeout.
"""

from __future__ import annotations

import sys
import time


def main(argv):
    import numpy as np
    import torch

    import torch_api
    from torch_api import _launch

    K, chunk, dtype, reverse = int(argv[0]), int(argv[1]), argv[2], argv[3] == "1"
    real = _launch.launch_direct
    # The interpreter (TRITON_INTERPRET=1) runs it on the CPU, with its own tiles.
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def traced(plan, inputs, outputs, stream=None):
        kernel = getattr(plan.kernel, "__name__", None) or plan.kernel.fn.__name__
        tiles = {k: v for k, v in plan.constexprs.items() if k in ("BT", "BK", "BV", "BS", "IEEE", "REVERSE")}
        options = f"warps {plan.num_warps} stages {plan.num_stages}"
        print(f"launch {kernel} grid {plan.grid} {tiles} {options}", flush=True)
        start = time.perf_counter()
        real(plan, inputs, outputs, stream)
        if device == "cuda":
            torch.cuda.synchronize()
        print(f"  done in {(time.perf_counter() - start) * 1e3:.1f} ms", flush=True)

    _launch.launch_direct = traced
    rng = np.random.default_rng(3)
    dt = getattr(torch, dtype)

    def rand(*shape, scale=1.0, dtype=dt):
        x = torch.tensor(rng.standard_normal(shape) * scale, dtype=dtype, device=device)
        return x.requires_grad_(True)

    T, HQ, H = 600, 4, 2
    q, k, v = rand(1, T, HQ, K), rand(1, T, H, K, scale=K**-0.5), rand(1, T, H, K)
    g = torch.nn.functional.logsigmoid(rand(1, T, H, dtype=torch.float32) + 2.0).detach().requires_grad_(True)
    gamma = torch.nn.functional.logsigmoid(rand(H, dtype=torch.float32) + 2.0).detach().requires_grad_(True)
    h0 = rand(1, H, K, K, dtype=torch.float32)
    o, ht = torch_api.chunk_linear_attn(
        q, k, v, g=g, g_gamma=gamma, initial_state=h0, reverse=reverse, chunk_size=chunk
    )
    grads = torch.autograd.grad((o.float().square().sum() + ht.sum()), (q, k, v, g, gamma, h0))
    print("finished; all finite:", all(bool(torch.isfinite(x).all()) for x in grads), flush=True)
    # The float64 reference the test compares against, timed too: on the
    # GPU machine 16 test workers share 16 cores, each with torch's default
    # thread count.
    from core_triton.linear_attn.naive import linear_attention_ref

    named = {"query": q, "key": k, "value": v, "g": g, "g_gamma": gamma, "initial_state": h0}
    arrays = {n: t.detach().double().cpu().numpy() for n, t in named.items()}
    start = time.perf_counter()
    linear_attention_ref(arrays, None, reverse, None, np.ones(o.shape), np.ones(ht.shape), torch)
    seconds = time.perf_counter() - start
    print(f"float64 reference: {seconds:.1f} s on {torch.get_num_threads()} threads", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
