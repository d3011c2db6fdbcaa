"""When the chunk state passes split over the sequence, and how finely
(core_triton/linear_attn/state_split.py): the choices the H100 measurements
behind its constants made, checked on the plans as the H100 gets them."""

from core_triton.common.launch import TensorInfo
from core_triton.common.utils import contiguous_strides
from core_triton.linear_attn import chunk
from core_triton.linear_attn.chunk_fwd_output import chunk_fwd_output_segment_kernel
from core_triton.linear_attn.chunk_fwd_state import chunk_fwd_state_segment_kernel
from core_triton.linear_attn.state_split import (
    forward_only_segment_chunks,
    long_segment_chunks,
    segment_chunks,
    state_split_carry_kernel,
)

H100 = 132


def _info(shape, dtype="bfloat16"):
    return TensorInfo(tuple(shape), dtype, contiguous_strides(shape))


def _segment_lengths(launches):
    """S of each pass from zero (its last parameter) among ``launches``."""
    return [s.params[-1] for s in launches if s.kernel is chunk_fwd_state_segment_kernel]


def test_batch_one_splits_and_fuller_grids_do_not():
    # H16, K = V = 128 in 64 x 64 tiles: 4 tiles a head.
    assert segment_chunks(1, 16, 4, 512, H100) == 32  # B1 T32k: 16 segments
    assert segment_chunks(1, 16, 4, 2048, H100) == 63  # B1 T128k: 33 segments
    assert segment_chunks(2, 16, 4, 2048, H100) == 0  # 128 programs: enough
    assert segment_chunks(4, 16, 4, 64, H100) == 0  # B4 T4k
    assert segment_chunks(16, 16, 4, 528, H100) == 0  # 16 packed documents
    assert segment_chunks(1, 16, 4, 32, H100) == 0  # one segment: nothing to split


def test_plans_split_at_batch_one_and_long_sequences():
    def launches(B, T, cu=None):
        q = _info((B, T, 16, 128))
        g = _info((B, T, 16), "float32")
        p = chunk.plans(q, q, q, g, cu_seqlens=cu)
        return [s.kernel for s in (*p.forward, *p.backward)]

    assert launches(1, 32768).count(state_split_carry_kernel) == 2  # forward and backward
    assert state_split_carry_kernel not in launches(4, 4096)
    assert state_split_carry_kernel not in launches(1, 32768, _info((17,), "int32"))  # 16 documents
    assert launches(1, 32768, _info((2,), "int32")).count(state_split_carry_kernel) == 2  # one


def test_forward_only_segments():
    # The longest of 64, 32, 16 chunks that leaves two segments a sequence.
    assert forward_only_segment_chunks(2048) == 64  # T128k
    assert forward_only_segment_chunks(128) == 64
    assert forward_only_segment_chunks(127) == 32
    assert forward_only_segment_chunks(64) == 32  # B4 T4k
    assert forward_only_segment_chunks(32) == 16  # 16 documents in T32k
    assert forward_only_segment_chunks(31) == 0


def test_long_segments_where_a_wave_stays():
    # Output-pass programs a segment: sequences x H16 x 2 V tiles of 64.
    assert long_segment_chunks(512, 1, 32, H100, 128) == 0  # B1 T32k: 64 (8 segments) as before
    assert long_segment_chunks(1024, 1, 32, H100, 128) == 128  # B1 T64k: 8 segments, 256 programs
    assert long_segment_chunks(2048, 1, 32, H100, 128) == 256  # B1 T128k: 8 segments
    assert long_segment_chunks(2048, 1, 16, H100, 128) == 128  # 8 heads: 16 segments
    assert long_segment_chunks(2048, 1, 32, H100, 64) == 0  # K = 64: more programs an SM
    assert long_segment_chunks(512, 4, 32, H100, 128) == 0  # B4 T32k, 4 documents in T128k: not measured
    assert long_segment_chunks(128, 16, 32, H100, 128) == 0  # 16 documents in T128k: 64 as before


def test_long_segments_in_the_forward_alone(monkeypatch):
    # The plans as the H100 gets them: a forward no gradient follows at one
    # long sequence takes 8 segments; the training call keeps its split.
    monkeypatch.setattr(chunk, "multiprocessor_count", lambda: H100)
    chunk._make_plans.cache_clear()
    try:
        for T, S in ((32768, 64), (65536, 128), (131072, 256)):
            q = _info((1, T, 16, 128))
            for gates in ((_info((1, T, 16), "float32"), None), (None, _info((16,), "float32"))):
                p = chunk.plans(q, q, q, *gates)
                seg = _segment_lengths(p.inference)
                assert seg == [S], (T, gates[0] is None)
                trained = _segment_lengths(p.forward)
                if S != 64:
                    assert trained and S not in trained, (T, trained)
        # K = V = 64: the output pass holds more programs an SM than the
        # rule's two, so the forward alone keeps segments of 64.
        q = _info((1, 131072, 16, 64))
        p = chunk.plans(q, q, q, _info((1, 131072, 16), "float32"))
        assert _segment_lengths(p.inference) == [64]
        # Batch 2 of T64k (not measured): segments of 64, as before.
        q = _info((2, 65536, 16, 128))
        p = chunk.plans(q, q, q, _info((2, 65536, 16), "float32"))
        assert _segment_lengths(p.inference) == [64]
    finally:
        chunk._make_plans.cache_clear()


def test_forward_only_plans_where_they_differ(monkeypatch):
    # A call no gradient follows gets its own forward where it splits
    # otherwise than training, or keeps half-precision chunk states out of
    # memory where training stores them: chunk g at B4 T4k (whole walk in
    # training), B1 T32k (segments of 32 in training, 64 here) and 16
    # documents in T32k; lightning's half-precision states at B4 T4k, B1
    # T32k and 16 documents of T32k; neither at 64 documents.
    monkeypatch.setattr(chunk, "multiprocessor_count", lambda: H100)
    chunk._make_plans.cache_clear()

    def plans(B, T, gate=True, cu=None):
        q = _info((B, T, 16, 128))
        g = _info((B, T, 16), "float32") if gate else None
        gamma = None if gate else _info((16,), "float32")
        return chunk.plans(q, q, q, g, gamma, cu_seqlens=cu)

    try:
        docs16, docs64 = _info((17,), "int32"), _info((65,), "int32")
        for B, T, gate, cu in (
            (4, 4096, True, None), (1, 32768, True, None), (1, 32768, True, docs16),
            (4, 4096, False, None), (1, 32768, False, None), (1, 32768, False, docs16),
        ):  # fmt: skip
            p = plans(B, T, gate, cu)
            assert chunk_fwd_output_segment_kernel in [s.kernel for s in p.inference], (B, T, gate, cu)
            assert p.forward_only == p.inference
        for p in (plans(4, 1024), plans(1, 32768, True, docs64)):
            assert p.inference == () and p.forward_only == p.forward
    finally:
        chunk._make_plans.cache_clear()


def test_gradient_walks_where_they_pay(monkeypatch):
    # Lightning (a g_gamma without gradient, one query head a state head)
    # takes the backward's gradient walks at B1 T32k (segments of 64) and in
    # 16 documents (segments of 16), not at B4 T4k (whole walks measured
    # faster) nor in 256 short documents (segments of less than 16 chunks);
    # grouped queries and a g_gamma that gets its gradient keep the stored
    # chunk states.
    from core_triton.linear_attn import lightning
    from core_triton.linear_attn.chunk_bwd_dqk import chunk_bwd_dqk_kernel

    monkeypatch.setattr(chunk, "multiprocessor_count", lambda: H100)
    chunk._make_plans.cache_clear()

    def segments(B, T, cu=None, HQ=16, op="lightning"):
        q, k = _info((B, T, HQ, 128)), _info((B, T, 16, 128))
        if op == "lightning":
            p = lightning.plans(q, k, k, 1, 4, cu_seqlens=cu)[0]
        else:
            p = chunk.plans(q, k, k, None, _info((16,), "float32"), cu_seqlens=cu)
        walked = [s for s in p.backward if s.kernel is chunk_fwd_output_segment_kernel]
        if not walked:
            assert chunk_bwd_dqk_kernel in [s.kernel for s in p.backward]
            return 0
        assert len(walked) == 3 and chunk_bwd_dqk_kernel not in [s.kernel for s in p.backward]
        return walked[0].params[-1]  # S

    try:
        assert segments(1, 32768) == 64
        assert segments(1, 32768, _info((17,), "int32")) == 16
        assert segments(4, 4096) == 0
        assert segments(1, 32768, _info((257,), "int32")) == 0
        assert segments(1, 32768, HQ=32) == 0
        assert segments(1, 32768, op="chunk") == 0
    finally:
        chunk._make_plans.cache_clear()
