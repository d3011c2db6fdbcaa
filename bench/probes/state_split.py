"""Probe: the chunk ops' time against the state passes' segment length
(core_triton/linear_attn/state_split.py), PyTorch binding, bfloat16, H16,
K = V = 128: what PROGRAMS_PER_SM and MIN_SEGMENT_CHUNKS were chosen from.

``python -m bench.probes.state_split [S ...]`` (S = 0: whole walk;
"auto": the plan's own choice; "trained": the plan's own choice with the
forward a differentiated call runs, no forward-only split).  Shapes: B1 T32k and T128k (one
sequence), B1 T32k and T128k in 16 documents, B4 T4k.
"""

import sys

from bench.common import timed
from bench.linear_attention import _inputs, _torch_pair
from bench.long_context import _cu, _ours

SHAPES = [(1, 32768, 0), (1, 131072, 0), (1, 32768, 16), (1, 131072, 16), (4, 4096, 0)]


def main(argv):
    import torch

    import torch_api
    from core_triton.linear_attn.state_split import forced_segments

    sizes = argv or ["0", "trained", "auto", "16", "32", "64"]
    for B, T, docs in SHAPES:
        for op, gate in (("chunk", "g"), ("lightning", "g_gamma")):
            x = _inputs(torch, gate, (B, T, 16, 128))
            if op == "lightning":
                x.pop("g_gamma")
            fwd, fwd_bwd = _torch_pair(torch, _ours(torch_api, op, _cu(torch, T, docs)), x, list(x))
            line = []
            for s in sizes:
                sync = lambda _: torch.cuda.synchronize()  # noqa: E731
                setting = {"auto": (None,), "trained": (None, True, False)}.get(s) or (int(s),)
                with forced_segments(*setting):
                    f, fb = timed(fwd, sync) * 1e3, timed(fwd_bwd, sync) * 1e3
                line.append(f"S={s}: {f:.3f}/{fb:.3f}")
            print(f"{op} B{B} T{T} docs{docs} (fwd/fwd+bwd ms): " + "  ".join(line), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
