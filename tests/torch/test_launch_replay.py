"""The torch binding replays a plan's compiled launch after its first call
(core_triton.common.launch).  A replay must give the same bits as Triton's own
launch path, and must not be used for tensors the compiled kernel was not
specialised for (another address alignment)."""

import pytest
import torch
import triton

import torch_api
from core_triton.common import launch as core_launch
from torch_api import _launch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="replays compiled kernels only")


def _rand(*shape, generator):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator)


def _misaligned_copy(x):
    """``x``'s values at an address 2 bytes past a 16-byte boundary, same
    shape and strides."""
    base = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    y = base[1:].view(x.shape)
    y.copy_(x)
    assert y.data_ptr() % 16 != 0
    return y


def _lightning(q, k, v, do):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o, final = torch_api.lightning_attn(q, k, v, layer_idx=1, num_layers=4)
    grads = torch.autograd.grad(o, (q, k, v), do)
    return (o, final, *grads)


def _flash(q, k, v, do):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = torch_api.flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    return (o, *grads)


def _flash_ids(q, k, v, do):
    """Head dim 128 at 2048 with segment ids: on sm_90 every launch of the
    forward's and backward's gated pairs, the Gluon kernels (which need
    global scratch) first."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    ids = (torch.arange(q.shape[1], device=q.device) * 3 // q.shape[1]).expand(q.shape[0], -1).int()
    o = torch_api.flash_attention(q, k, v, causal=True, q_segment_ids=ids)
    grads = torch.autograd.grad(o, (q, k, v), do)
    return (o, *grads)


@pytest.mark.parametrize(
    "op, shape",
    [
        (_lightning, (2, 200, 4, 64)),
        (_flash, (2, 200, 4, 64)),
        (_flash, (1, 2048, 2, 128)),
        (_flash_ids, (1, 2048, 2, 128)),
    ],
    ids=["lightning", "flash", "flash d128 (Gluon)", "flash d128 ids (Gluon, gated)"],
)
def test_replay_gives_the_same_bits(op, shape, monkeypatch):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (_rand(*shape, generator=g) for _ in range(4))
    core_launch._replays.clear()
    _launch._fast.clear()
    first = op(q, k, v, do)
    replays = [entry[1] for entry in core_launch._replays.values()]
    assert replays and all(r is not None for r in replays), "every launch should be replayable"
    direct = triton.__version__.startswith(core_launch._DIRECT_TRITON)
    if direct:
        # The second call goes through the compiled launcher's C entry,
        # every launch by the binding's fast path.
        assert all(r.direct is not None for r in replays)
        assert len(_launch._fast) == len(replays)
    if shape[-1] == 128 and torch.cuda.get_device_capability() == (9, 0):
        # The plan's Gluon kernels, which need global scratch, among them.
        with_scratch = [r for r in replays if r.scratch[0]]
        assert len(with_scratch) >= 2, "the Gluon forward and dQ (causal dK/dV takes Gluon from 4k)"
        assert not direct or all(r.direct is not None for r in with_scratch)
    fast_launches = []
    real_call = _launch._Fast.__call__

    def counted(self, inputs):
        out = real_call(self, inputs)
        fast_launches.append(out is not None)
        return out

    monkeypatch.setattr(_launch._Fast, "__call__", counted)
    second = op(q, k, v, do)
    if direct:
        assert fast_launches and all(fast_launches), fast_launches
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The same plans on misaligned copies: the replay must step aside (the
    # kernels were specialised for 16-byte aligned addresses) and Triton's
    # own path must give the same values.
    fast_launches.clear()
    third = op(*(_misaligned_copy(t) for t in (q, k, v, do)))
    if direct:
        assert not all(fast_launches), "the fast path launched on misaligned addresses"
    for a, b in zip(first, third, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
