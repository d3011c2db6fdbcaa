"""The sinks' gradient and the ring's merge / sink add
(core_triton.attention.softmax_parts) specialise alike for every length
and batch: only grids and run-time sizes follow them (the numbers are
checked through flash_attention and ring_attention against float64)."""

from core_triton.attention import softmax_parts
from core_triton.common.launch import TensorInfo
from tests.core.test_runtime_sizes import _signature


def _plans(B, T):
    sink = TensorInfo((6, 3), "bfloat16", (3, 1))
    return [
        softmax_parts.sink_grad_plan(sink, (B, 6, T)),
        softmax_parts.ring_merge_plan(B, T, 6, 40),
        softmax_parts.ring_sinks_plan(B, T, 6, 40, sink),
    ]


def test_one_specialisation_for_every_size():
    first = [_signature(p) for p in _plans(2, 100)]
    for B, T in ((3, 4096), (7, 6001)):
        assert [_signature(p) for p in _plans(B, T)] == first
