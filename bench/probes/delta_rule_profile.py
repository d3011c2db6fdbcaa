"""Per-kernel device time of the chunk gated delta rule, ours (PyTorch
binding) beside fla, from torch.profiler: where the forward and the
backward spend their time.  Same inputs as bench/delta_rule.py.

    python -m bench.probes.delta_rule_profile [gdn|kda] [B T docs]

``TILES='[{"state": {"BV": 64}}, ...]'`` profiles our op once per entry
(chunk.TILE_OVERRIDES, with the entry's ``"settings"`` set as chunk's
module settings, e.g. ``{"settings": {"WU_IN_WALK": false}}``, or steps' as
``"steps.SUMS_IN_L2NORM"``; fla once),
``FWD_ONLY=1`` skips the backward, ``NO_FLA=1`` leaves fla out.  Each
line also gives the wall time per call (bench.common.timed).
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

import torch

import torch_api
from bench.common import timed
from bench.delta_rule import _fla, _inputs, _ours
from core_triton.delta_rule import chunk, gated_delta_rule, steps


def _setting(name: str):
    """(module, attribute) of a setting: chunk's, or ``steps.NAME``."""
    module, _, attr = name.rpartition(".")
    return {"": chunk, "steps": steps}[module], attr


def use_tiles(tiles: dict) -> None:
    """Plan the chunk mode with ``tiles`` (chunk.TILE_OVERRIDES, and its
    ``"settings"``: chunk's module settings, or steps' as ``"steps.NAME"``;
    settings an earlier entry changed go back) from the next call on."""
    tiles = dict(tiles)
    settings = tiles.pop("settings", {})
    for name, value in DEFAULTS.items():
        setattr(*_setting(name), value)
    for name, value in settings.items():
        DEFAULTS.setdefault(name, getattr(*_setting(name)))
        setattr(*_setting(name), value)
    chunk.TILE_OVERRIDES.clear()
    chunk.TILE_OVERRIDES.update(tiles)
    gated_delta_rule._make_plans.cache_clear()


# chunk's module settings as they were before use_tiles changed them.
DEFAULTS: dict = {}


def profile(fn, label, reps=5):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times, counts = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name] += e.device_time / reps
            counts[e.name] += 1
    total = sum(times.values())
    wall = timed(fn, lambda _: torch.cuda.synchronize()) * 1e3
    print(f"\n## {label}: {total / 1e3:.3f} ms of kernels per call, {wall:.3f} ms wall", flush=True)
    for name, t in sorted(times.items(), key=lambda kv: -kv[1])[:14]:
        print(f"  {t / 1e3:8.3f} ms  x{counts[name] // reps:<3} {name[:90]}", flush=True)


def main(argv):
    op = argv[0] if argv else "gdn"
    B, T, docs = (int(a) for a in argv[1:4]) if len(argv) >= 4 else (4, 4096, 0)
    x, cu = _inputs(torch, op, B, T, docs)
    leaves = {n: v.clone().requires_grad_(True) for n, v in x.items()}
    do = torch.randn_like(x["value"])
    variants = json.loads(os.environ.get("TILES", "[{}]"))
    impls = [(f"ours {json.dumps(v)}", _ours(torch_api), v) for v in variants]
    try:
        if not os.environ.get("NO_FLA"):
            impls.append(("fla", _fla(op), None))
    except Exception as e:  # noqa: BLE001
        print("no fla:", e)
    for name, fn, tiles in impls:
        if tiles is not None:
            use_tiles(tiles)

        def fwd(fn=fn):
            with torch.no_grad():
                return fn(x, cu)

        def fwd_bwd(fn=fn):
            return torch.autograd.grad(fn(leaves, cu), list(leaves.values()), do)

        shape = f"{op} B{B} T{T} docs{docs}"
        try:
            profile(fwd, f"{name} fwd {shape}")
        except Exception as e:  # noqa: BLE001 (a variant that does not build: the next one)
            print(f"{name} fwd failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        if os.environ.get("FWD_ONLY"):
            continue
        try:
            profile(fwd_bwd, f"{name} fwd+bwd {shape}")
        except Exception as e:  # noqa: BLE001 (fla's Hopper guard)
            print(f"{name} fwd+bwd refused: {type(e).__name__}: {str(e)[:100]}")


if __name__ == "__main__":
    main(sys.argv[1:])
