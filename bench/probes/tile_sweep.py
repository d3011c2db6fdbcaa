"""A tuning aid (not part of ``nox -s bench``): the PyTorch autotuner's
timing of every candidate tile of the flash kernels, one sweep per
autotuning key (mask, gate of a segment-ids pair, dK/dV split), at the
shapes head dim 64's measured tiles were read from
(``core_triton.attention.flash_configs._measured_64``): B1 with 32 query
heads on 4 (T 2k, 4k, 16k causal; 4k full; 4 documents of segment ids at 4k
and 16k), B4 H16 T1k and 8k and B16 H16 T2k, causal or not.  bf16.
``python -m bench.probes.tile_sweep [HEAD_DIM]`` (default 64); each line
lists the candidates with their time relative to the best."""

from __future__ import annotations

import sys
import time

import numpy as np

# B, T, query heads, key heads, causal, documents (segment ids).
SHAPES = [
    (1, 4096, 32, 4, True, 1),
    (1, 4096, 32, 4, True, 4),
    (1, 16384, 32, 4, True, 1),
    (1, 16384, 32, 4, True, 4),
    (1, 2048, 32, 4, True, 1),
    (4, 8192, 16, 16, True, 1),
    (4, 8192, 16, 16, False, 1),
    (16, 2048, 16, 16, True, 1),
    (16, 2048, 16, 16, False, 1),
    (4, 1024, 16, 16, True, 1),
    (4, 1024, 16, 16, False, 1),
    (1, 4096, 32, 4, False, 1),
]


def _record(records):
    """Wrap Triton's autotuner so that each new key's sweep is kept:
    (kernel name, key, {tile: ms})."""
    from triton.runtime.autotuner import Autotuner

    run = Autotuner.run

    def recording(self, *args, **kwargs):
        before = set(self.cache)
        out = run(self, *args, **kwargs)
        for key in set(self.cache) - before:
            times = {}
            for c, t in self.configs_timings.items():
                name = f"{c.kwargs['BM']}x{c.kwargs['BN']}/{c.num_warps}w/{c.num_stages}s"
                times[name] = t[0] if isinstance(t, list) else t
            records.append((self.fn.__name__, key, times))
        return out

    Autotuner.run = recording


def main(argv):
    import torch

    import torch_api
    from bench.segments import doc_lengths
    from core_triton.attention import flash, flash_configs

    D = int(argv[0]) if argv else 64
    records = []
    _record(records)
    flash_configs.MEASURED = False  # autotune every head dim
    flash.replan()
    for B, T, HQ, H, causal, docs in SHAPES:
        start = time.time()
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        do = torch.randn_like(q)
        kw = {}
        if docs > 1:
            ids = np.repeat(np.arange(docs), doc_lengths(T, docs))[None]
            kw["q_segment_ids"] = torch.tensor(ids, device="cuda", dtype=torch.int32)
        leaves = [x.requires_grad_() for x in (q, k, v)]
        seen = len(records)
        out = torch_api.flash_attention(*leaves, causal=causal, **kw)
        torch.autograd.grad(out, leaves, do)
        torch.cuda.synchronize()
        print(f"== B{B} T{T} {HQ}:{H} causal={causal} docs={docs} ({time.time() - start:.0f}s)", flush=True)
        for name, key, times in records[seen:]:
            best = min(times.values())
            ranked = sorted(times.items(), key=lambda kv: kv[1])
            # The key's first 11 entries: D, DV, the mask flags, GATE (and the split).
            line = ", ".join(f"{c} {t / best:.3f}" for c, t in ranked)
            print(f"  {name} key={key[:11]}: {line}", flush=True)
            print(f"    (best {best:.4f} ms)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
