import pytest

from tests.frameworks import TorchFramework
from tests.suites.chunk_linear_attn import (
    SMALL,
    ChunkLinearAttnGpuSuite,
    ChunkLinearAttnLargeTileSuite,
    ChunkLinearAttnSuite,
)
from tests.suites.recurrent import check_case, make_case

FW = TorchFramework()


class TestTorchChunkLinearAttn(ChunkLinearAttnSuite):
    fw = FW

    def test_non_contiguous_inputs(self):
        x, cu, cots = make_case(FW, gates=("g", "g_gamma"), h0=True, seed=11, **SMALL)

        def fn(query, key, g, **kw):
            # Views with the strides of other layouts.
            q = query.transpose(1, 2).contiguous().transpose(1, 2)
            k = key.transpose(0, 1).contiguous().transpose(0, 1)
            gg = g.transpose(1, 2).contiguous().transpose(1, 2)
            assert not q.is_contiguous() and not k.is_contiguous() and not gg.is_contiguous()
            return FW.api.chunk_linear_attn(q, k, g=gg, **kw, chunk_size=16)

        check_case(FW, fn, x, cu, cots)

    def test_float64_is_refused(self):
        z = FW.torch.zeros(1, 2, 1, 3, dtype=FW.torch.float64, device=FW.device)
        with pytest.raises(TypeError, match="dtype"):
            FW.api.chunk_linear_attn(z, z, z)


class TestTorchChunkLinearAttnGpu(ChunkLinearAttnGpuSuite):
    fw = FW


class TestTorchChunkLinearAttnLargeTiles(ChunkLinearAttnLargeTileSuite):
    fw = FW
