"""Kernel times of one-segment attention against plain (torch profiler),
causal B1 32 on 4 heads bf16: which launch costs what.  Offline probe."""

import torch
from torch.profiler import ProfilerActivity, profile

import torch_api


def main():
    for T, D in ((4096, 64), (16384, 64), (4096, 128)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, T, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(1, T, 4, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        ids = torch.zeros(1, T, dtype=torch.int32, device="cuda")
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        do = torch.randn_like(q)
        for name, kw in (
            ("plain", {}),
            ("segment ids", {"q_segment_ids": ids}),
            ("cu_seqlens", {"cu_seqlens": cu}),
        ):

            def step(leaves=leaves, kw=kw, do=do):
                out = torch_api.flash_attention(*leaves, causal=True, **kw)
                torch.autograd.grad(out, leaves, do)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            rows = [
                (e.key, e.device_time_total / e.count, e.count)
                for e in prof.key_averages()
                if e.device_time_total > 0
            ]
            print(
                f"T={T} D={D} {name}:",
                ", ".join(f"{k[:40]} {t:.1f}us x{c // 5}" for k, t, c in sorted(rows, key=lambda r: -r[1])),
                flush=True,
            )


if __name__ == "__main__":
    main()
