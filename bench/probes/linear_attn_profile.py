"""Per-kernel device time of the chunk linear-attention ops (chunk ``g``,
lightning), ours (PyTorch binding) beside fla, from torch.profiler: where
the forward and the backward spend their time at batch 1 and long context
(bench/long_context.py's inputs).

    python -m bench.probes.linear_attn_profile [T [docs]]

``VARIANTS='[{"segments": 0}, {"tiles": {"chunk_state": {"BV": 128}}}]'``
profiles our ops once per entry (``segments``: state_split.forced_segments,
None = the plan's; ``fused_output`` false: the split forward that stores the
chunk states; ``tiles``: chunk.TILE_OVERRIDES); ``FWD_ONLY=1`` skips the
backward; ``OPS=chunk,lightning`` picks the ops.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import torch_api
from bench.linear_attention import _inputs, _torch_pair
from bench.long_context import H, _cu, _fla, _ours
from bench.probes.delta_rule_profile import profile
from core_triton.linear_attn import chunk
from core_triton.linear_attn.state_split import forced_segments


def main(argv):
    T = int(argv[0]) if argv else 32768
    docs = int(argv[1]) if len(argv) > 1 else 0
    variants = json.loads(os.environ.get("VARIANTS", "[{}]"))
    cu = _cu(torch, T, docs)
    for op in os.environ.get("OPS", "chunk,lightning").split(","):
        x = _inputs(torch, "g" if op == "chunk" else "g_gamma", (1, T, H, 128))
        if op == "lightning":
            x.pop("g_gamma")
        impls = [(f"ours {json.dumps(v)}", _ours(torch_api, op, cu), v) for v in variants]
        try:
            impls.append(("fla", _fla(op, cu), None))
        except Exception as e:  # noqa: BLE001
            print("no fla:", e)
        for name, fn, v in impls:
            chunk.TILE_OVERRIDES.clear()
            chunk.TILE_OVERRIDES.update((v or {}).get("tiles", {}))
            chunk._make_plans.cache_clear()
            fwd, fwd_bwd = _torch_pair(torch, fn, x, list(x))
            shape = f"{op} B1 T{T} docs{docs}"
            with forced_segments((v or {}).get("segments"), (v or {}).get("fused_output", True)):
                profile(fwd, f"{name} fwd {shape}")
                if os.environ.get("FWD_ONLY"):
                    continue
                try:
                    profile(fwd_bwd, f"{name} fwd+bwd {shape}")
                except Exception as e:  # noqa: BLE001 (fla's Hopper guard)
                    print(f"{name} fwd+bwd refused: {type(e).__name__}: {str(e)[:100]}")
            torch.cuda.empty_cache()
    chunk.TILE_OVERRIDES.clear()


if __name__ == "__main__":
    main(sys.argv[1:])
