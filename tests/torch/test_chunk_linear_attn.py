import pytest

from tests.frameworks import TorchFramework
from tests.suites.chunk_linear_attn import (
    SMALL,
    ChunkLinearAttnGpuSuite,
    ChunkLinearAttnLargeTileSuite,
    ChunkLinearAttnSuite,
    forward_only_segments,
    launched_kernels,
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

    def test_forward_only_road(self):
        # The eager road takes the op's forward-only launches exactly when
        # autograd records nothing: grad mode off, or no input requiring
        # grad; a call it records keeps the training launches.
        from core_triton.linear_attn.chunk_fwd_output import chunk_fwd_output_segment_kernel

        torch = FW.torch
        x, _, _ = make_case(FW, gates=("g",), h0=True, seed=18, **SMALL)
        t = {n: FW.array(a) for n, a in x.items()}
        leaf = {n: a.clone().requires_grad_(True) for n, a in t.items()}
        with forward_only_segments(FW, (1,)):
            for inputs, grad_mode, forward_only in (
                (t, True, True), (leaf, False, True), (leaf, True, False)
            ):  # fmt: skip
                with torch.set_grad_enabled(grad_mode), launched_kernels(FW) as kernels:
                    out, _ = FW.api.chunk_linear_attn(**inputs, chunk_size=16)
                assert (chunk_fwd_output_segment_kernel in kernels) == forward_only
                assert (out.grad_fn is None) == forward_only

    def test_float64_is_refused(self):
        z = FW.torch.zeros(1, 2, 1, 3, dtype=FW.torch.float64, device=FW.device)
        with pytest.raises(TypeError, match="dtype"):
            FW.api.chunk_linear_attn(z, z, z)


class TestTorchChunkLinearAttnGpu(ChunkLinearAttnGpuSuite):
    fw = FW


class TestTorchChunkLinearAttnLargeTiles(ChunkLinearAttnLargeTileSuite):
    fw = FW
