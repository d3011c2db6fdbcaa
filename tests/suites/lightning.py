"""Lightning-attention tests, written once for both frameworks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from core_triton.linear_attn.naive import lightning_g_gamma
from tests.reference import assert_close
from tests.suites.chunk_linear_attn import check_lightning_walks, state_split
from tests.suites.kernel_level import KernelLevelCases
from tests.suites.recurrent import check_case, make_case

MATRIX = list(itertools.product(["chunk", "recurrent"], [False, True], [False, True]))
# What a binding whose kernel_cases is False runs: each mode with reverse and
# packed each both ways.
BINDING_MATRIX = [
    ("chunk", False, False),
    ("chunk", True, True),
    ("recurrent", False, True),
    ("recurrent", True, False),
]


class LightningSuite(KernelLevelCases):
    fw = None  # set by the framework's module

    @pytest.mark.parametrize("mode,reverse,packed", MATRIX)
    def test_matches_reference(self, mode, reverse, packed):
        self._kernel_level((mode, reverse, packed) in BINDING_MATRIX)
        H, layer_idx, num_layers = 4, 1, 3
        x, cu, cots = make_case(self.fw, packed=packed, h0=True, HQ=8, H=H, K=16, V=16, seed=20)
        g_gamma = lightning_g_gamma(H, layer_idx, num_layers)
        api = self.fw.api

        def fn(**kw):
            return api.lightning_attn(
                **kw, layer_idx=layer_idx, num_layers=num_layers, reverse=reverse, mode=mode
            )

        check_case(self.fw, fn, x, cu, cots, reverse=reverse, ref_extra={"g_gamma": g_gamma})

    @pytest.mark.parametrize("packed,reverse,size", [(False, False, 2), (True, True, 2), (True, False, 1)])
    def test_split_gradient_walks(self, packed, reverse, size):
        # A training call split into segments of one or two 64-token chunks:
        # the forward's output from the segments' start states and a
        # backward of gradient walks (chunk.py), no chunk state in memory
        # either way.  Batched: rows of 3 chunks (the last partial), so a
        # segment of two carries its state over a chunk inside the walk.
        # Packed: 150, 0, 29 and 141 tokens (segments shorter than, as long
        # as and longer than a sequence; an empty one).  Both directions,
        # with an initial state and a final-state cotangent.
        self._kernel_level((packed, reverse, size) == (True, True, 2))
        with state_split(self.fw, size):
            check_lightning_walks(
                self.fw, reverse=reverse, layer_idx=2, num_layers=5, seed=23, packed=packed, B=2, T=150,
                HQ=2, H=2, K=20, V=12, cu=[0, 150, 150, 179, 320],
            )  # fmt: skip

    def test_modes_agree_and_last_layer_decays_least(self):
        fw, api = self.fw, self.fw.api
        x, _, _ = make_case(fw, B=1, T=40, HQ=2, H=2, K=8, V=8, seed=21)
        q, k, v = (fw.array(x[n]) for n in ("query", "key", "value"))
        chunk = api.lightning_attn(q, k, v, 2, 4)
        rec = api.lightning_attn(q, k, v, 2, 4, mode="recurrent")
        assert_close(fw.numpy(chunk[0]), fw.numpy(rec[0]), "float32", "output")
        assert_close(fw.numpy(chunk[1]), fw.numpy(rec[1]), "float32", "final_state")
        g = lightning_g_gamma(2, 3, 4)
        assert g[0] == 0 and g[1] == -(8 / 2) * (1 - 3 / 4)

    def test_bad_arguments(self):
        fw, api = self.fw, self.fw.api
        x, _, _ = make_case(fw, B=1, T=3, HQ=2, H=2, K=4, V=4)
        q, k, v = (fw.array(x[n]) for n in ("query", "key", "value"))
        for layer_idx, num_layers in [(3, 3), (-1, 3), (0, 0)]:
            with pytest.raises(ValueError, match="layer_idx|num_layers"):
                api.lightning_attn(q, k, v, layer_idx, num_layers)
        with pytest.raises(TypeError, match="layer_idx"):
            api.lightning_attn(q, k, v, 1.0, 3)
        with pytest.raises(ValueError, match="mode"):
            api.lightning_attn(q, k, v, 0, 3, mode="fused")
        assert np.isfinite(fw.numpy(api.lightning_attn(q, k, v, 0, 1)[0])).all()
