"""A tuning aid (not part of ``nox -s bench``): the packed chunk-local
cumsum (what the gated delta rule runs on KDA's per-channel gates: B1 T32k
in 16 documents, HV 32, K 128, float32, chunks of 64) with each count of
feature tiles per program (core_triton.cumsum.plan.PACKED_FEATURE_TILES),
beside the same tokens batched (B4 T8k) and fla's ``chunk_local_cumsum``,
device time from CUDA-graph replay.  ``python -m bench.probes.cumsum_packed``;
``CUMSUM_SWEEP=1`` also times the packed case at each feature-tile width
(plan.MAX_FEATURE_TILE), warp count (plan.PACKED_NUM_WARPS) and count of feature
tiles a program of 1 and 8."""

from __future__ import annotations

import os

from bench.common import graph_time_per_call


def main():
    import torch

    import torch_api
    from core_triton.cumsum import plan

    gen = torch.Generator(device="cuda").manual_seed(0)
    T, H, K = 32768, 32, 128
    x = torch.randn(1, T, H, K, device="cuda", generator=gen)
    cuts = torch.randperm(T // 64 - 1, generator=torch.Generator().manual_seed(0))[:15] + 1
    cu = torch.cat([torch.zeros(1), cuts.sort().values * 64.0, torch.full((1,), float(T))])
    cu = cu.to(device="cuda", dtype=torch.int32)
    batched = x.view(4, T // 4, H, K)
    nbytes = 2 * x.numel() * 4
    default = plan.PACKED_FEATURE_TILES
    warps_default, bf_default = plan.PACKED_NUM_WARPS, plan.MAX_FEATURE_TILE
    line = []
    for ft in (1, 2, 4, 8, 16, 64):
        plan.PACKED_FEATURE_TILES = ft
        plan.make_plans.cache_clear()
        t = graph_time_per_call(torch, lambda: torch_api.chunk_local_cumsum(x, 64, cu_seqlens=cu))
        line.append(f"packed FT {ft}: {t * 1e6:.1f} us ({nbytes / t / 1e9:.0f} GB/s)")
    plan.PACKED_FEATURE_TILES = default
    plan.make_plans.cache_clear()
    if os.environ.get("CUMSUM_SWEEP"):
        for bf in (32, 64, 128):
            for warps in (2, 4, 8):
                for ft in (1, 8):
                    plan.MAX_FEATURE_TILE, plan.PACKED_NUM_WARPS, plan.PACKED_FEATURE_TILES = bf, warps, ft
                    plan.make_plans.cache_clear()
                    t = graph_time_per_call(torch, lambda: torch_api.chunk_local_cumsum(x, 64, cu_seqlens=cu))
                    line.append(f"packed BF {bf} warps {warps} FT {ft}: {t * 1e6:.1f} us")
                    print(line[-1], flush=True)
        plan.MAX_FEATURE_TILE, plan.PACKED_NUM_WARPS = bf_default, warps_default
        plan.PACKED_FEATURE_TILES = default
        plan.make_plans.cache_clear()
    t = graph_time_per_call(torch, lambda: torch_api.chunk_local_cumsum(batched, 64))
    line.append(f"batched B4: {t * 1e6:.1f} us ({nbytes / t / 1e9:.0f} GB/s)")
    try:
        from fla.ops.utils.cumsum import chunk_local_cumsum

        t = graph_time_per_call(torch, lambda: chunk_local_cumsum(x, 64, cu_seqlens=cu))
        line.append(f"fla packed: {t * 1e6:.1f} us ({nbytes / t / 1e9:.0f} GB/s)")
    except Exception as e:  # noqa: BLE001
        line.append(f"fla: {type(e).__name__}: {e}")
    print("\n".join(line), flush=True)


if __name__ == "__main__":
    main()
