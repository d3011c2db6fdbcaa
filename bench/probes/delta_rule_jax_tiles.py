"""Forward time of the chunk gated delta rule, both bindings, per tile
variant (chunk.TILE_OVERRIDES): where the JAX binding's time differs from
PyTorch's.  ``python -m bench.probes.delta_rule_jax_tiles`` (GDN B4 T4k)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import torch

import jax_api
import torch_api
from bench.common import timed
from bench.delta_rule import _inputs, _jax_pair, _ours, _torch_pair
from bench.probes.delta_rule_profile import use_tiles

VARIANTS = json.loads(os.environ.get("TILES", '[{}, {"state": {"BV": 32}}, {"output": {"num_stages": 1}}]'))


def main():
    x, cu = _inputs(torch, "gdn", 4, 4096, 0)
    for tiles in VARIANTS:
        use_tiles(tiles)
        fwd_t, _ = _torch_pair(torch, _ours(torch_api), x, cu)
        fwd_j, _ = _jax_pair(jax, jnp, _ours(jax_api), x, cu)
        t = timed(fwd_t, lambda _: torch.cuda.synchronize())
        j = timed(fwd_j, lambda o: jax.block_until_ready(o))
        print(f"{json.dumps(tiles):45} torch {t * 1e3:.3f} ms  jax {j * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
