"""Small integer helpers shared by the launch plans."""

import functools


def cdiv(a, b):
    """Ceiling division, ``-(-a // b)``; works on ints and on array types."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def contiguous_strides(shape) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    strides = []
    acc = 1
    for size in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(int(size), 1)
    return tuple(reversed(strides))


def prod(shape) -> int:
    """Number of elements of ``shape``."""
    n = 1
    for s in shape:
        n *= int(s)
    return n


def cached_checks(maxsize: int):
    """Decorator: cache a planner that checks its arguments, so an eager call
    with arguments seen before costs one lookup.

    Lists become tuples first (a framework may hand ``[left, right]`` for a
    pair).  The cache is typed: ``True`` and ``1`` (or ``1.0``) never share a
    result, so a check that refuses an int for a bool still runs.  An
    argument that cannot be hashed skips the cache, and the planner's own
    check names it."""

    def wrap(fn):
        cached = functools.lru_cache(maxsize=maxsize, typed=True)(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            args = tuple(tuple(a) if isinstance(a, list) else a for a in args)
            kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
            try:
                hash((args, tuple(kwargs.items())))
            except TypeError:
                return fn(*args, **kwargs)
            return cached(*args, **kwargs)

        call.cache_clear = cached.cache_clear
        return call

    return wrap
