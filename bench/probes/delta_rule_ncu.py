"""One call of the chunk gated delta rule (ours or fla) inside a profiler
range, for Nsight Compute: what each kernel reads, its occupancy, its
registers and shared memory.  Same inputs as bench/delta_rule.py.

    ncu --profile-from-start off --clock-control none \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        python -m bench.probes.delta_rule_ncu [ours|fla] [fwd|fwd+bwd] [gdn|kda] [B T docs]

Two calls run first outside the range (compiling, autotuning).
"""

from __future__ import annotations

import sys

import torch

import torch_api
from bench.delta_rule import _fla, _inputs, _ours
from bench.probes import profiled_call


def main(argv):
    impl, mode, op = (argv + ["ours", "fwd", "kda"][len(argv) :])[:3]
    B, T, docs = (int(a) for a in argv[3:6]) if len(argv) >= 6 else (4, 4096, 0)
    x, cu = _inputs(torch, op, B, T, docs)
    fn = _fla(op) if impl == "fla" else _ours(torch_api)
    leaves = {n: v.clone().requires_grad_(True) for n, v in x.items()}
    do = torch.randn_like(x["value"])

    def fwd():
        with torch.no_grad():
            fn(x, cu)

    def fwd_bwd():
        torch.autograd.grad(fn(leaves, cu), list(leaves.values()), do)

    profiled_call(torch, fwd if mode == "fwd" else fwd_bwd)


if __name__ == "__main__":
    main(sys.argv[1:])
