import numpy as np
import pytest

from core_triton.attention.naive import attention_ref
from tests.frameworks import TorchFramework
from tests.reference import assert_close
from tests.suites.flash_attention import FlashAttentionSuite, make_case, spy_launches, vjp, ws_forward_on

FW = TorchFramework()


class TestTorchFlashAttention(FlashAttentionSuite):
    fw = FW

    def test_non_contiguous_inputs(self):
        # Head-first tensors transposed to [B, T, H, D] views, a sliced bias
        # and a transposed cotangent: read through their strides, no copy.
        case = make_case(np.random.default_rng(9), B=2, Tq=40, Tk=40, bias="BH")
        t = {
            n: FW.array(np.swapaxes(case[n], 1, 2).copy()).transpose(1, 2) for n in ("query", "key", "value")
        }
        wide = FW.array(np.concatenate([case["bias"], case["bias"]], axis=-1))
        t["bias"] = wide[..., :40]
        do = np.random.default_rng(10).standard_normal((2, 40, 4, 16))
        do_t = FW.array(np.swapaxes(do, 1, 2).copy()).transpose(1, 2)
        (out, lse), grads = vjp(
            FW,
            lambda **d: FW.api.flash_attention(**d, causal=True, return_lse=True),
            t,
            (do_t, FW.array(np.zeros((2, 4, 40)))),  # on the test device, like the inputs
        )
        ref = attention_ref(**case, causal=True, do=do)
        assert_close(FW.numpy(out), ref["out"], "float32", "output")
        for n, r in (("query", "dq"), ("key", "dk"), ("value", "dv"), ("bias", "dbias")):
            assert_close(FW.numpy(grads[n]), ref[r], "float32", n)

    def test_expanded_lse_cotangent(self):
        # ``lse.sum()`` in the loss: autograd hands the op an expanded
        # (stride 0) cotangent, which the dQ kernel reads as a contiguous
        # [B, HQ, Tq] array once the binding lays it out so.
        case = make_case(np.random.default_rng(13), B=2, Tq=40, Tk=40, seg="q")
        do = np.random.default_rng(14).standard_normal((2, 40, 4, 16))
        leaves = {n: FW.array(case[n]).requires_grad_(True) for n in ("query", "key", "value")}
        out, lse = FW.api.flash_attention(
            **leaves, q_segment_ids=FW.array(case["q_segment_ids"], "int32"), causal=True, return_lse=True
        )
        ((out * FW.array(do)).sum() + lse.sum()).backward()
        ref = attention_ref(**case, causal=True, do=do, dlse=np.ones((2, 4, 40)))
        for n, r in (("query", "dq"), ("key", "dk"), ("value", "dv")):
            assert_close(FW.numpy(leaves[n].grad), ref[r], "float32", n)

    def test_unaligned_views_take_the_descriptor_kernels(self, monkeypatch):
        # Contiguous views that start 2 bytes into their storage: the
        # warp-specialised forward (forced on; the plan's pick on sm_90)
        # builds tensor descriptors, which need 16-byte aligned bases, so
        # the launcher hands it aligned copies.  Gradients flow back to the
        # views' storage.
        import torch

        from core_triton.attention import flash_tma_plans

        case = make_case(np.random.default_rng(11), Tq=70, Tk=70, HQ=2, H=1, D=128)
        flats, views = {}, {}
        for n in ("query", "key", "value"):
            x = torch.from_numpy(case[n]).to(FW.device, torch.bfloat16)
            flat = torch.zeros(x.numel() + 1, dtype=torch.bfloat16, device=FW.device)
            flat[1:] = x.reshape(-1)
            flats[n] = flat.requires_grad_(True)
            views[n] = flats[n][1:].view(x.shape)
            assert views[n].data_ptr() % 16 != 0
        do = np.random.default_rng(12).standard_normal((1, 70, 2, 128))
        with ws_forward_on(FW):
            seen_plans = spy_launches(FW, monkeypatch)
            out = FW.api.flash_attention(**views, causal=True)
            out.backward(FW.array(do, "bfloat16"))
        assert seen_plans[0].kernel is flash_tma_plans.flash_fwd_ws_kernel
        seen = {n: FW.numpy(v.detach()) for n, v in views.items()}
        ref = attention_ref(**seen, causal=True, do=FW.numpy(FW.array(do, "bfloat16")))
        assert_close(FW.numpy(out.detach()), ref["out"], "bfloat16", "output")
        for n, r in (("query", "dq"), ("key", "dk"), ("value", "dv")):
            assert_close(FW.numpy(flats[n].grad[1:].view(views[n].shape)), ref[r], "bfloat16", n)


def _gpu_memory() -> float:
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0.0


@pytest.mark.xdist_group("gpu_memory")
def test_64bit_offsets_long_sequence():
    """Query, output and their gradients of 2.28e9 elements (T = 1,114,112,
    16 heads of 128, bf16; about 25 GB in all): offsets past 2**31 take the
    ROW64 path.  With a causal window of 128 keys, the last 1024 rows (of
    the output, dq, dk, dv) equal what the same computation gives on the
    last 1152 tokens alone (whose first 128 rows see fewer keys).  The slice
    starts on a multiple of every block size, so both runs do the same
    arithmetic; the bf16 tolerance still catches rows read from the wrong
    place, which give errors of order 1."""
    import torch

    if _gpu_memory() < 40e9:
        pytest.skip("needs a CUDA GPU with > 40 GB")
    torch.manual_seed(0)
    B, T, HQ, H, D, S, keep = 1, 2**20 + 2**16, 16, 2, 128, 1152, 1024
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(B, T, HQ, D, device=dev, dtype=bf16)
    k, v = (torch.randn(B, T, H, D, device=dev, dtype=bf16) for _ in range(2))
    do = torch.randn(B, T, HQ, D, device=dev, dtype=bf16)

    def run(q, k, v, do):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = FW.api.flash_attention(*leaves, causal=True, sliding_window=(128, 0))
        out.backward(do)
        return [out.detach(), *(t.grad for t in leaves)]

    big = [x[:, -keep:].cpu() for x in run(q, k, v, do)]
    small = run(*(x[:, -S:].contiguous() for x in (q, k, v, do)))
    for name, a, b in zip(("output", "dq", "dk", "dv"), big, small, strict=True):
        assert_close(FW.numpy(a), FW.numpy(b[:, -keep:]), "bfloat16", name)
    del q, k, v, do, big, small
    torch.cuda.empty_cache()  # the next big test in this worker may be JAX's


@pytest.mark.xdist_group("gpu_memory")
def test_gluon_64bit_offsets(monkeypatch):
    """The Gluon forward and backward (forced on) past 2**31 elements, bf16,
    head dim 128, 128 keys a batch (about 18 GB for q, dO, out and dq each
    time):

    * one batch of 2**20 + 2**16 queries, 16 heads on 16: the last 1024
      rows of the output and dq equal a run on those queries alone (each
      row's arithmetic is its own); dK and dV (each key's sum over every
      query) equal a float32 reference computed in chunks of queries;
    * 544 batches of 2048 queries, 16 heads on 2 (batch 512 on starts past
      2**31): the last batch's output and every gradient equal a run on it
      alone.

    The long batch keeps 16 heads on 16: forced on, the Gluon dK/dV does
    not split a group, and with 16 on 2 one program sums 8.9M rows, whose
    accumulation alone costs about 8e-3 (the same in the Triton kernel
    unsplit; the plan splits past flash_configs.DKDV_ROWS_MAX: docs/design.md,
    "The Gluon flash backward on Hopper")."""
    import torch

    from core_triton.attention import flash_bwd_dkdv_gluon, flash_bwd_dq_gluon
    from tests.suites.flash_attention import gluon_backward_set, gluon_forward_runs

    if _gpu_memory() < 60e9 or not gluon_forward_runs():
        pytest.skip("needs an sm_90 GPU with > 60 GB")
    torch.manual_seed(1)
    bf16, D, Tk = torch.bfloat16, 128, 128
    seen = spy_launches(FW, monkeypatch)

    def run(q, k, v, do):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        out = FW.api.flash_attention(*leaves)
        out.backward(do)
        return [out.detach(), *(t.grad for t in leaves)]

    def inputs(B, Tq, HQ, H):
        q, do = (torch.randn(B, Tq, HQ, D, device="cuda", dtype=bf16) for _ in range(2))
        k, v = (torch.randn(B, Tk, H, D, device="cuda", dtype=bf16) for _ in range(2))
        return q, k, v, do

    with ws_forward_on(FW, gluon="on"), gluon_backward_set(FW, "on"):
        q, k, v, do = inputs(1, 2**20 + 2**16, 16, 16)
        out, dq, dk, dv = run(q, k, v, do)
        small = run(q[:, -1024:].contiguous(), k, v, do[:, -1024:].contiguous())
        for name, a, b in (("output", out, small[0]), ("dq", dq, small[1])):
            assert_close(FW.numpy(a[:, -1024:]), FW.numpy(b), "bfloat16", f"one batch: {name}")
        del out, dq, small
        dk_ref, dv_ref = _chunked_dk_dv(q, k, v, do)
        for name, got, ref in (("dk", dk, dk_ref), ("dv", dv, dv_ref)):
            assert_close(FW.numpy(got), ref.double().cpu().numpy(), "bfloat16", f"one batch: {name}")
        del q, k, v, do, dk, dv, dk_ref, dv_ref
        torch.cuda.empty_cache()
        q, k, v, do = inputs(544, 2048, 16, 2)
        big = [x[-1:].clone() for x in run(q, k, v, do)]
        small = run(*(x[-1:].contiguous() for x in (q, k, v, do)))
        for name, a, b in zip(("output", "dq", "dk", "dv"), big, small, strict=True):
            assert_close(FW.numpy(a), FW.numpy(b), "bfloat16", f"last batch: {name}")
    kernels = [p.kernel for p in seen]
    assert flash_bwd_dq_gluon.flash_bwd_dq_gluon_kernel in kernels, kernels
    assert flash_bwd_dkdv_gluon.flash_bwd_dkdv_gluon_kernel in kernels, kernels
    del q, k, v, do, big, small
    torch.cuda.empty_cache()


def _chunked_dk_dv(q, k, v, do, chunk=2**16):
    """dK and dV ``[1, Tk, H, D]`` of plain attention over one batch in
    float32, over chunks of ``chunk`` queries (key head ``h`` serves query
    heads ``h * G .. h * G + G - 1``)."""
    import torch

    HQ, H, D = q.shape[2], k.shape[2], q.shape[3]
    kf, vf = (x.float().repeat_interleave(HQ // H, dim=2)[0].transpose(0, 1) for x in (k, v))  # [HQ, Tk, D]
    dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
    for start in range(0, q.shape[1], chunk):
        qc, doc = (x[0, start : start + chunk].float().transpose(0, 1) for x in (q, do))  # [HQ, n, D]
        p = torch.softmax(qc @ kf.transpose(1, 2) * D**-0.5, dim=-1)
        dp = doc @ vf.transpose(1, 2)
        ds = p * (dp - (p * dp).sum(-1, keepdim=True))
        dk += ds.transpose(1, 2) @ qc * D**-0.5
        dv += p.transpose(1, 2) @ doc
    Tk = k.shape[1]
    return tuple(x.view(H, HQ // H, Tk, D).sum(1).transpose(0, 1)[None] for x in (dk, dv))


def test_broadcast_bias_gradient_memory():
    """B4 H16 T4096 D128 bf16, causal, fwd + bwd: a [1, 1, T, T] bf16 bias
    that needs a gradient adds about its own size (the gradient, 32 MiB) to
    the peak, not a float32 [B, HQ, T, T] buffer (4 GiB): within 10% of the
    no-bias peak (q, k, v, dO, out, dq, dk, dv: 512 MiB).  One that needs
    none adds nothing."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    B, T, H, D = 4, 4096, 16, 128
    torch.manual_seed(0)

    def peak(bias):
        start = torch.cuda.memory_allocated()
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        do = torch.randn_like(q)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        FW.api.flash_attention(q, k, v, bias=bias, causal=True).backward(do)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start

    base = peak(None)
    bias = torch.randn(1, 1, T, T, device="cuda", dtype=torch.bfloat16)
    size = bias.numel() * bias.element_size()
    const = peak(bias)
    grad = peak(bias.requires_grad_(True))
    assert const <= base + 8 * 2**20, (base, const)
    assert grad <= base + 1.25 * size + 8 * 2**20, (base, grad, size)
    assert grad <= 1.1 * base, (base, grad)


def test_inference_road(monkeypatch):
    """A call autograd does not record (grad mode off, inference mode, or no
    input requiring grad) takes flash's inference road: outputs equal bit
    for bit to the recorded road's and float64's, nothing requiring grad.
    Under forward-mode AD (whose dual tensors do not require grad) it keeps
    the recorded road, which says it has no jvp rather than dropping the
    tangents."""
    import importlib

    import torch

    fa = importlib.import_module("torch_api.flash_attention")
    roads = []
    real = fa._forward  # the recorded road holds its own reference; the inference road looks it up
    monkeypatch.setattr(fa, "_forward", lambda a: roads.append("inference") or real(a))
    case = make_case(np.random.default_rng(3), B=1, Tq=37, Tk=37, H=2, HQ=4)
    q, k, v = (FW.array(case[n], "float32") for n in ("query", "key", "value"))
    ids = FW.array((np.arange(37) >= 20).astype(np.int32)[None], "int32")

    def call(*qkv):
        return fa.flash_attention(*qkv, causal=True, q_segment_ids=ids, return_lse=True)

    recorded = call(*(t.clone().requires_grad_(True) for t in (q, k, v)))
    assert roads == [] and all(o.requires_grad for o in recorded)
    want = attention_ref(**{**case, "q_segment_ids": np.asarray(ids.cpu())}, causal=True)["out"]
    assert_close(FW.numpy(recorded[0].detach()), want, "float32")
    with torch.no_grad():
        off = call(*(t.clone().requires_grad_(True) for t in (q, k, v)))
    with torch.inference_mode():
        frozen = call(q, k, v)
    plain = call(q, k, v)
    assert roads == ["inference"] * 3
    for got in (off, frozen, plain):
        assert not any(o.requires_grad for o in got)
        for a, b in zip(got, recorded, strict=True):
            torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(q, torch.randn_like(q))
        with pytest.raises(NotImplementedError, match="jvp"):
            call(dual, k, v)
    assert roads == ["inference"] * 3
