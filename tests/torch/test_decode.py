from tests.frameworks import TorchFramework
from tests.suites.decode import DecodeSuite


class TestTorchDecode(DecodeSuite):
    fw = TorchFramework()


def test_decode_compiles_fullgraph_and_exports():
    """One custom-op node under torch.compile(fullgraph=True) and
    torch.export, with the eager values."""
    import numpy as np
    import torch

    import torch_api
    from tests.suites.decode import make

    fw = TorchFramework()
    x, _, _ = make(np.random.default_rng(5), 2, 2, 4, 2, 16, 16, 40, 8, [40, 9], "1d")
    a = {n: fw.array(v, "int32" if v.dtype == np.int32 else "float32") for n, v in x.items()}

    def f(query, key_cache, value_cache, kv_lens, block_table, softmax_aux):
        return torch_api.decode_attention(
            query, key_cache, value_cache, kv_lens, block_table, sliding_window=6, softmax_aux=softmax_aux
        )

    torch._dynamo.reset()
    eager = f(**a)
    compiled = torch.compile(f, fullgraph=True)(**a)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)

    class M(torch.nn.Module):
        def forward(self, query, key_cache, value_cache, kv_lens, block_table, softmax_aux):
            return f(query, key_cache, value_cache, kv_lens, block_table, softmax_aux)

    ep = torch.export.export(M(), (), kwargs=a)
    assert any("decode_attention" in str(n.target) for n in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(**a), eager, rtol=0, atol=0)
