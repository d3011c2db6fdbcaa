"""Meta tensors (no data, as ``torch.device("meta")`` model
initialisation and shape tracing use them): every op gives outputs of the
right shapes and dtypes on the meta device, as torch's own ops do, through
its fake implementation (no kernel runs, nothing is read), backward too;
mixed with real tensors, the device check names both."""

from __future__ import annotations

import pytest
import torch

import torch_api

B, T, H, D = 1, 64, 2, 16


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _cases():
    x, x1 = _meta(B, T, H, D), _meta(B, 1, H, D)
    beta, lens = _meta(B, T, H), torch.empty(B, dtype=torch.int32, device="meta")
    seg = torch.empty(B, T, dtype=torch.int32, device="meta")
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    return {
        "flash": (lambda: (torch_api.flash_attention(x, x, x, causal=True),), [(B, T, H, D)]),
        "flash segment ids": (
            lambda: (torch_api.flash_attention(x, x, x, q_segment_ids=seg, kv_segment_ids=seg),),
            [(B, T, H, D)],
        ),
        "flash packed": (lambda: (torch_api.flash_attention(x, x, x, cu_seqlens=cu),), [(B, T, H, D)]),
        "decode": (lambda: (torch_api.decode_attention(x1, x, x, lens),), [(B, 1, H, D)]),
        "chunk": (lambda: torch_api.chunk_linear_attn(x, x, x), [(B, T, H, D), (B, H, D, D)]),
        "recurrent": (lambda: torch_api.recurrent(x, x, x), [(B, T, H, D), (B, H, D, D)]),
        "lightning": (lambda: torch_api.lightning_attn(x, x, x, 0, 2), [(B, T, H, D), (B, H, D, D)]),
        "delta rule": (
            lambda: torch_api.gated_delta_rule(x, x, x, beta, output_final_state=True),
            [(B, T, H, D), (B, H, D, D)],
        ),
        "cumsum": (lambda: (torch_api.chunk_local_cumsum(beta, 16),), [(B, T, H)]),
    }


@pytest.mark.parametrize("name", list(_cases()))
def test_meta_tensors_give_shapes(name):
    call, shapes = _cases()[name]
    outs = call()
    assert [tuple(o.shape) for o in outs] == shapes
    assert all(o.device.type == "meta" for o in outs)


def test_meta_backward_and_mixed_devices():
    q = _meta(B, T, H, D).requires_grad_(True)
    torch_api.flash_attention(q, q, q, causal=True).sum().backward()
    assert q.grad.shape == q.shape and q.grad.device.type == "meta"
    real = torch.randn(B, T, H, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="query on cpu, key on meta"):
        torch_api.flash_attention(real, _meta(B, T, H, D), _meta(B, T, H, D))
    # Packed boundaries elsewhere than the data (once: a launch on them
    # failed inside Triton), checked before any launch.
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="cu_seqlens on meta"):
        torch_api.flash_attention(real, real, real, cu_seqlens=cu)
