"""The ranged forward (segment ids, packed input: ``HAS_RANGE``) on packed
documents: kernel time under the torch profiler for each candidate tile
of the ranged launch, beside plain attention, to tell a per-program cost
from a per-tile one (B1, 32 query heads on 4, causal, bf16).

    python -m bench.probes.ranged_fwd            # the tile sweep
    python -m bench.probes.ranged_fwd bwd        # the same for the backward kernels
    python -m bench.probes.ranged_fwd plan       # the plan's tiles only, unsorted ids too
    python -m bench.probes.ranged_fwd edge       # the backward's edge-run stages
    ncu --profile-from-start off ... python -m bench.probes.ranged_fwd ncu [T D docs]

Offline probe."""

from __future__ import annotations

import functools
import sys

import torch

import torch_api
from bench.probes.segment_profile import kernel_times
from core_triton.attention import flash as core

CANDIDATES = {
    128: [None, (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 2), (32, 32, 4, 3), (128, 32, 8, 3)],
    64: [None, (128, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 3), (128, 64, 8, 3, 128), (64, 32, 4, 3)],
}


def _inputs(T, D, docs):
    """``docs`` equal documents; negative: ``-docs`` runs of two ids in turn
    (unsorted ids: every tile of a range masked)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, T, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, T, 4, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    ids = (torch.arange(T, device="cuda", dtype=torch.int32) // (T // abs(docs)))[None]
    if docs < 0:
        ids = ids % 2
    return q, k, v, ids


def _fwd_bwd(q, k, v, ids):
    """A forward+backward call of ``flash_attention`` with ids ``ids``."""
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    do = torch.randn_like(q)

    def step():
        out = torch_api.flash_attention(*leaves, ids, causal=True)
        torch.autograd.grad(out, leaves, do)

    return step


def _force(pick, which="fwd"):
    """Plan the ranged ``which`` kernel ("fwd", "dq", "dkdv") on ``pick``
    (None: the plan's own)."""
    measured = core.measured_choice

    def choice(kind, dim_class, causal, Tq, Tk, ranged=False, *rest):
        if kind == which and ranged and pick is not None:
            return pick
        return measured(kind, dim_class, causal, Tq, Tk, ranged, *rest)

    core.measured_choice = choice
    core.replan()
    return measured


SHAPES = ((4096, 128, 64), (4096, 128, 4), (16384, 128, 64), (16384, 128, 4), (8192, 128, 2), (4096, 64, 64))
BACKWARD = {
    "dq": [None, (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3), (128, 32, 4, 3)],
    "dkdv": [None, (32, 64, 4, 3), (32, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 2)],
}


def sweep_backward():
    """Forward+backward kernel times, each ranged backward kernel on each
    candidate (head dim 128)."""
    for T, D, docs in SHAPES:
        if D != 128:
            continue
        step = _fwd_bwd(*_inputs(T, D, docs))
        for which, picks in BACKWARD.items():
            for pick in picks:
                measured = _force(pick, which)
                try:
                    took = kernel_times(step)
                    print(f"T={T} D={D} docs={docs} {which} {pick or 'plan'}: {took}", flush=True)
                finally:
                    core.measured_choice = measured
                    core.replan()


def edge():
    """Forward+backward kernel times with the ranged backward kernels'
    masked runs at the launch's stages, 1 and 2 (flash_configs.EDGE_STAGES),
    at the plan's tiles, packed documents and unsorted ids."""
    from core_triton.attention import flash_configs

    before = dict(flash_configs.EDGE_STAGES)
    shapes = ((4096, 128, 64), (4096, 128, 4), (16384, 128, 64), (8192, 128, 2), (8192, 128, -4))
    shapes += ((4096, 64, 64), (4096, 64, 4), (8192, 64, -4))
    for T, D, docs in shapes:
        step = _fwd_bwd(*_inputs(T, D, docs))
        for stages in (0, 1, 2):
            flash_configs.EDGE_STAGES.clear()
            flash_configs.EDGE_STAGES.update(before)
            # Every backward tile the plan may take at these shapes.
            for kind, tiles in (("dq", (64, 32, 4, 3)), ("dq", (64, 64, 4, 3)), ("dkdv", (32, 64, 4, 3))):
                for dim in (64, 128):
                    flash_configs.EDGE_STAGES[(kind, dim, tiles)] = stages
            core.replan()
            print(f"T={T} D={D} docs={docs} backward edge stages {stages}: {kernel_times(step)}", flush=True)
    flash_configs.EDGE_STAGES.clear()
    flash_configs.EDGE_STAGES.update(before)
    core.replan()


def sweep():
    for T, D, docs in SHAPES:
        q, k, v, ids = _inputs(T, D, docs)
        plain = kernel_times(functools.partial(torch_api.flash_attention, q, k, v, causal=True))
        print(f"T={T} D={D} docs={docs} plain: {plain}", flush=True)
        for pick in CANDIDATES[D]:
            measured = _force(pick)
            try:
                took = kernel_times(functools.partial(torch_api.flash_attention, q, k, v, ids, causal=True))
                print(f"T={T} D={D} docs={docs} ranged {pick or 'plan'}: {took}", flush=True)
            finally:
                core.measured_choice = measured
                core.replan()


def ncu(T=4096, D=128, docs=64):
    q, k, v, ids = _inputs(T, D, docs)
    for _ in range(2):
        torch_api.flash_attention(q, k, v, ids, causal=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    torch_api.flash_attention(q, k, v, ids, causal=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["ncu"]:
        ncu(*(int(a) for a in sys.argv[2:5]))
    elif sys.argv[1:2] == ["bwd"]:
        sweep_backward()
    elif sys.argv[1:2] == ["edge"]:
        edge()
    elif sys.argv[1:2] == ["plan"]:
        # The plan's own launches only, at every shape (and unsorted ids).
        CANDIDATES = {64: [None], 128: [None]}
        SHAPES += ((8192, 128, -4), (4096, 64, 4), (8192, 64, -4))
        sweep()
    else:
        sweep()
