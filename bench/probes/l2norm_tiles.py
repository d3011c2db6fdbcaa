"""Device time of the delta rule's L2-normalisation launch (use_qk_l2norm)
at the benchmark's query/key shape, per tile size and warp count, beside a
copy of the same bytes and fla's l2norm_fwd (CUDA-graph replay, us).

    python -m bench.probes.l2norm_tiles [T]
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from bench.common import graph_time_per_call
from core_triton.common.launch import run_named
from core_triton.delta_rule import l2norm
from torch_api._launch import launch


def main(argv):
    T = int(argv[0]) if argv else 32768
    shape = (1, T, 16, 128)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    base = l2norm.forward_plan("x", shape, "bfloat16", "y")
    ref = None
    for br in (16, 32, 64, 128):
        for warps in (2, 4, 8):
            plan = dataclasses.replace(
                base,
                grid=(-(-T * 16 // br),),
                constexprs={**base.constexprs, "BR": br},
                num_warps=warps,
            )
            y = run_named([plan], {"x": x}, launch)["y"]
            if ref is None:
                ref = y
            assert torch.equal(y, ref)
            us = graph_time_per_call(torch, lambda p=plan: run_named([p], {"x": x}, launch)) * 1e6
            print(f"BR {br:4d} warps {warps}: {us:8.1f} us", flush=True)
    us = graph_time_per_call(torch, lambda: x.clone()) * 1e6
    print(f"copy (clone): {us:8.1f} us", flush=True)
    try:
        from fla.modules.l2norm import l2norm_fwd

        us = graph_time_per_call(torch, lambda: l2norm_fwd(x)[0]) * 1e6
        print(f"fla l2norm_fwd: {us:8.1f} us", flush=True)
    except Exception as e:  # noqa: BLE001 (a probe: report and go on)
        print("fla:", repr(e)[:200])


if __name__ == "__main__":
    main(sys.argv[1:])
