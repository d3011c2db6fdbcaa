import pytest

from tests.frameworks import TorchFramework
from tests.suites.recurrent import RecurrentSuite, check_case, make_case

FW = TorchFramework()


class TestTorchRecurrent(RecurrentSuite):
    fw = FW

    def test_non_contiguous_inputs(self):
        x, cu, cots = make_case(FW, gates=("g", "gk"), h0=True, seed=11)

        def fn(query, key, **kw):
            # Transposed views of another layout: the binding reads them right.
            q = query.transpose(1, 2).contiguous().transpose(1, 2)
            k = key.transpose(0, 1).contiguous().transpose(0, 1)
            assert not q.is_contiguous() and not k.is_contiguous()
            return FW.api.recurrent(q, k, **kw)

        check_case(FW, fn, x, cu, cots)

    def test_float64_is_refused(self):
        z = FW.torch.zeros(1, 2, 1, 3, dtype=FW.torch.float64, device=FW.device)
        with pytest.raises(TypeError, match="dtype"):
            FW.api.recurrent(z, z, z)


def _large_gpu():
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_properties(0).total_memory > 40e9


@pytest.mark.xdist_group("gpu_memory")
def test_64bit_offsets_long_sequence():
    """T = 65,536 and a query past 2**31 elements: the last group of query
    heads (whose offsets pass 2**31) gives what the same group gives alone."""
    import torch

    if not _large_gpu():
        pytest.skip("needs a CUDA GPU with > 40 GB")
    torch.manual_seed(0)
    B, T, H, G, K, V = 1, 65536, 4, 66, 128, 16
    dev = "cuda"
    q = torch.randn(B, T, H * G, K, device=dev, dtype=torch.bfloat16)
    assert q.numel() > 2**31
    k = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=dev) + 3)
    do = torch.randn(B, T, H * G, V, device=dev, dtype=torch.bfloat16)

    def run(q, k, v, g, do):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v, g)]
        o, ht = FW.api.recurrent(*leaves[:3], g=leaves[3])
        o.backward(do)
        return o.detach(), ht, [t.grad for t in leaves]

    o, ht, grads = run(q, k, v, g, do)
    del q
    # The same random query again (same seed), keeping only the last group.
    torch.manual_seed(0)
    q_again = torch.randn(B, T, H * G, K, device=dev, dtype=torch.bfloat16)[:, :, -G:].contiguous()
    o1, ht1, grads1 = run(q_again, k[:, :, -1:], v[:, :, -1:], g[:, :, -1:], do[:, :, -G:])
    assert torch.equal(o[:, :, -G:], o1)
    assert torch.equal(ht[:, -1:], ht1)
    assert torch.equal(grads[0][:, :, -G:], grads1[0])
    for big, small in zip(grads[1:], grads1[1:], strict=True):
        assert torch.equal(big[:, :, -1:], small)
    del o, ht, grads, o1, ht1, grads1
    torch.cuda.empty_cache()  # the next big test in this worker may be JAX's
