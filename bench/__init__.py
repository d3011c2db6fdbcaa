"""Benchmarks: ``python -m bench`` (or ``nox -s bench``) on a CUDA machine."""
