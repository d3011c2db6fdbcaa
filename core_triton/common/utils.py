"""Small integer helpers shared by the launch plans."""


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
