"""One forward call with segment ids inside a profiler range, for Nsight
Compute: the persistent Gluon forward as a gated pair's first launch
(``pair``) or taking the call alone (``ranged``, flash.set_gluon_ranged),
or plain attention (``plain``), B1, 32 query heads on 4, causal, bf16.
What the RANGED kernel's one segment loses against the pair's first launch
(issue 32; 191.9 against 174.8 us at T4k head dim 64, 45th session) shows
in its warp stall reasons and per-line counters:

    ncu --profile-from-start off --clock-control none \\
        --section WarpStateStats --section SchedulerStats --section SourceCounters \\
        --kernel-name flash_fwd_gluon_kernel \\
        python -m bench.probes.segment_ncu [pair|ranged|plain] [T D docs]

Two calls run first outside the range (compiling, the ranges kept by
neither: each call makes its own)."""

from __future__ import annotations

import sys

import torch

import torch_api
from bench.probes import profiled_call
from core_triton.attention import flash


def main(argv):
    mode = argv[0] if argv else "pair"
    T, D, docs = (int(a) for a in argv[1:4]) if len(argv) >= 4 else (4096, 64, 1)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, T, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, T, 4, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    ids = (torch.arange(T, device="cuda", dtype=torch.int32) * docs // T)[None]
    kw = {} if mode == "plain" else {"q_segment_ids": ids}
    flash.set_gluon_ranged(mode == "ranged")
    try:

        def call():
            with torch.no_grad():
                torch_api.flash_attention(q, k, v, causal=True, **kw)

        profiled_call(torch, call)
    finally:
        flash.set_gluon_ranged(False)


if __name__ == "__main__":
    main(sys.argv[1:])
