"""The segment-ranges launch (core_triton.attention.segment_ranges) at
several scan widths, warps and stages, beside the kernel as it was
(``bench/probes/_old_ranges.py`` where present: a copy of the module
before a change); kernel time under the torch profiler (us, mean of 20
launches), each output checked equal to the first variant's.  B1, sorted
ids (one segment, 4 and 64 documents) and shuffled ones.  Offline probe:
``python -m bench.probes.ranges_scan``."""

import dataclasses
import importlib

import torch

from bench.probes.segment_profile import kernel_times
from core_triton.attention import segment_ranges
from core_triton.common.launch import TensorInfo
from torch_api._launch import launch


def _variants():
    found = {}

    def variant(module, scan, warps, stages=1):
        def plan(info):
            p = module.range_plan(info, info, "ids", "ids")
            return dataclasses.replace(
                p, constexprs={**p.constexprs, "SCAN": scan}, num_warps=warps, num_stages=stages
            )

        return plan

    try:
        old = importlib.import_module("bench.probes._old_ranges")
        found["before"] = lambda info: old.range_plan(info, info, "ids", "ids")
        for scan, warps in ((4096, 8), (2048, 8), (4096, 16), (2048, 16)):
            found[f"before scan {scan} {warps}w"] = variant(old, scan, warps)
    except ImportError:
        pass
    found["as planned"] = lambda info: segment_ranges.range_plan(info, info, "ids", "ids")
    for scan, warps in ((1024, 8), (1024, 16), (2048, 16), (512, 16), (4096, 16)):
        found[f"scan {scan} {warps}w"] = variant(segment_ranges, scan, warps)
    return found


def main():
    variants = _variants()
    for T in (4096, 16384):
        g = torch.Generator(device="cuda").manual_seed(0)
        for name, n in (("one segment", 1), ("4 docs", 4), ("64 docs", 64), ("shuffled 64", -64)):
            ids = torch.arange(T, device="cuda", dtype=torch.int32) // (T // abs(n))
            if n < 0:
                ids = ids[torch.randperm(T, device="cuda", generator=g)]
            ids = ids[None].contiguous()
            info = TensorInfo(tuple(ids.shape), "int32", tuple(ids.stride()), str(ids.device))
            first = None
            line = []
            for label, make in variants.items():
                plan = make(info)
                out = launch(plan, {"ids": ids})
                if first is None:
                    first = out
                else:
                    same = all(torch.equal(a, b) for a, b in zip(first, out, strict=True))
                    assert same, f"{label} differs at T={T} {name}"
                times = kernel_times(lambda plan=plan, ids=ids: launch(plan, {"ids": ids}), calls=20)
                line.append(f"{label} {sum(t for _, t in times):.1f}")
            print(f"T={T} {name}: " + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()
