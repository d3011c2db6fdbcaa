"""The ring's step schedule (core_triton.attention.ring.RingSchedule), which
both bindings walk: who visits at each step, the piece offsets, the bias
gradient's columns, and the steps the causal mask removes entirely."""

import pytest

from core_triton.attention.ring import RingSchedule, zigzag_order


@pytest.mark.parametrize("zigzag", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_shard_visits_once_and_every_bias_column_is_filled_once(n, zigzag):
    t_local = 8
    order = zigzag_order(n, n * t_local) if zigzag else list(range(n * t_local))
    for rank in range(n):
        steps = RingSchedule(n, t_local, zigzag).steps(rank)
        assert [s.index for s in steps] == list(range(n))
        assert sorted(s.src for s in steps) == list(range(n))
        assert steps[0].src == rank and [s.last for s in steps] == [False] * (n - 1) + [True]
        columns = []
        for s in steps:
            # The offsets turn local indices into global positions.
            shard = order[s.src * t_local : (s.src + 1) * t_local]
            pieces = len(s.k_offsets)
            c = t_local // pieces
            assert [i + s.k_offsets[i // c] for i in range(t_local)] == shard
            for a, g, length in s.bias_pieces:
                assert shard[a : a + length] == list(range(g, g + length))
                columns += range(g, g + length)
        assert sorted(columns) == list(range(n * t_local))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_masked_out_steps(n):
    t_local = 4
    for rank in range(n):
        causal = RingSchedule(n, t_local, False, causal=True).steps(rank)
        assert [s.masked_out for s in causal] == [s.src > rank for s in causal]
        assert not any(s.masked_out for s in RingSchedule(n, t_local, True, causal=True).steps(rank))
        assert not any(s.masked_out for s in RingSchedule(n, t_local, False).steps(rank))
        explicit = RingSchedule(n, t_local, False, causal=True, explicit_positions=True).steps(rank)
        assert all(s.masked_out is None for s in explicit)
        windowed = RingSchedule(n, t_local, False, causal=True, windowed=True).steps(rank)
        assert [s.masked_out for s in windowed] == [True if s.src > rank else None for s in windowed]
