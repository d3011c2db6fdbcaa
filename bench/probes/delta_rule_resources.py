"""What each gated_delta_rule kernel asks of the GPU, config by config:
shared memory, registers and spills of every launch of the forward and the
backward of both modes, for the configs the plans pick (K, V in 64, 128,
256, bfloat16 and float32, each gate kind).  A launch that does not
compile or does not fit prints its error instead, so one run shows every
config that needs other tiles.

``python -m bench.probes.delta_rule_resources [K,V ...] [bf16|f32]`` on a
CUDA GPU (``bf16``, ``f32``: those inputs only).  ``TILES='[{"state":
{"BV": 16}}, ...]'`` reports the chunk mode once per entry (as
delta_rule_profile takes them: tile overrides and ``"settings"``), to find
tiles that fit."""

from __future__ import annotations

import json
import os
import sys

import torch

import torch_api
from bench.probes.delta_rule_profile import use_tiles
from core_triton.common import launch as core_launch
from torch_api import _launch

CONFIGS = [(128, 128), (64, 64), (256, 256), (128, 64), (64, 256)]


def main(argv):
    configs = [tuple(map(int, a.split(","))) for a in argv if a not in ("bf16", "f32")] or CONFIGS
    picked = {"bf16": torch.bfloat16, "f32": torch.float32}
    dtypes = tuple(d for a, d in picked.items() if a in argv) or (torch.bfloat16, torch.float32)
    tiles = json.loads(os.environ.get("TILES", "null"))
    seen = {}
    original = core_launch.launch_direct

    def probe(plan, inputs, outputs, stream=None):
        kernel = plan.kernel
        name = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))
        key = (name, tuple(sorted((k, v) for k, v in plan.constexprs.items() if not isinstance(v, float))),
               plan.num_warps, plan.num_stages)  # fmt: skip
        try:
            grid = plan.grid if callable(plan.grid) else tuple(plan.grid)
            if plan.is_empty():
                return
            compiled = kernel[grid](*plan.arguments(inputs), *outputs, **plan.launch_options())
            meta = compiled.metadata
            text = f"smem {meta.shared:>6}  regs {compiled.n_regs:>3}  spills {compiled.n_spills:>4}"
        except Exception as e:  # report and go on: the next launch may fit
            text = f"ERROR {type(e).__name__}: {str(e)[:120]}"
            raise
        finally:
            if key not in seen:  # printed as it comes: a run cut short still reports
                seen[key] = text
                c = dict(key[1])
                short = {k: c[k] for k in ("K", "V", "BK", "BV", "GATE", "IEEE") if k in c}
                print(f"{name:34} {short} w{key[2]} s{key[3]}: {text}", flush=True)

    _launch.launch_direct = probe
    try:
        for over in tiles or [None]:
            if over is not None:
                print(f"# tiles {over}", flush=True)
                use_tiles(over)
                seen.clear()
            for K, V in configs:
                for dtype in dtypes:
                    for gate in (None, "g", "gk"):
                        _run(K, V, dtype, gate, ("chunk",) if tiles else ("chunk", "recurrent"))
    finally:
        _launch.launch_direct = original


def _run(K, V, dtype, gate, modes):
    torch.manual_seed(0)
    B, T, HK, HV = 1, 130, 2, 4
    x = {
        "query": torch.randn(B, T, HK, K, device="cuda", dtype=dtype),
        "key": torch.randn(B, T, HK, K, device="cuda", dtype=dtype),
        "value": torch.randn(B, T, HV, V, device="cuda", dtype=dtype),
        "beta": torch.rand(B, T, HV, device="cuda", dtype=dtype),
    }
    if gate == "g":
        x["g"] = -torch.rand(B, T, HV, device="cuda")
    if gate == "gk":
        x["gk"] = -torch.rand(B, T, HV, K, device="cuda")
    x["initial_state"] = torch.randn(B, HV, K, V, device="cuda")
    leaves = {n: t.requires_grad_(True) for n, t in x.items()}
    for mode in modes:
        try:
            o, h = torch_api.gated_delta_rule(
                **leaves, output_final_state=True, use_qk_l2norm=True, mode=mode
            )
            torch.autograd.backward([o, h], [torch.randn_like(o), torch.randn_like(h)])
            torch.cuda.synchronize()
        except Exception as e:
            print(f"K={K} V={V} {dtype} {gate} {mode}: {type(e).__name__}: {str(e)[:100]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
