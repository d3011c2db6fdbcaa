"""One small adapter per framework, so each test is written once and run
through both bindings (tests/jax and tests/torch pick their adapter)."""

from __future__ import annotations

import numpy as np


class TorchFramework:
    name = "torch"

    def __init__(self):
        import torch

        import torch_api

        self.torch = torch
        self.api = torch_api
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.dtypes = {
            "float32": torch.float32,
            "bfloat16": torch.bfloat16,
            "float16": torch.float16,
            "int32": torch.int32,
            "int64": torch.int64,
            "float64": torch.float64,
        }

    def array(self, x, dtype="float32"):
        return self.torch.tensor(np.asarray(x), device=self.device).to(self.dtypes[dtype])

    def numpy(self, x) -> np.ndarray:
        x = x.detach().cpu()
        return (x.double() if x.is_floating_point() else x).numpy()

    def dtype(self, name):
        return self.dtypes[name]

    def vjp(self, fn, x, dy):
        """(fn(x), d<fn(x), dy>/dx)."""
        x = x.detach().clone().requires_grad_(True)
        y = fn(x)
        y.backward(dy)
        return y, x.grad

    def clear_caches(self):
        """Nothing to drop: every eager call plans again (from core's caches)."""

    def vjp_many(self, fn, inputs: dict, cotangents):
        """(fn(**inputs), {name: gradient}) for an fn returning a tuple,
        pulled back from the tuple ``cotangents``."""
        leaves = {n: x.detach().clone().requires_grad_(True) for n, x in inputs.items()}
        outs = fn(**leaves)
        self.torch.autograd.backward(list(outs), list(cotangents))
        return outs, {n: x.grad for n, x in leaves.items()}


class JaxFramework:
    name = "jax"

    def __init__(self):
        import jax
        import jax.numpy as jnp

        import jax_api

        self.jax = jax
        self.jnp = jnp
        self.api = jax_api

    def array(self, x, dtype="float32"):
        return self.jnp.asarray(np.asarray(x), dtype=self.jnp.dtype(dtype))

    def numpy(self, x) -> np.ndarray:
        x = np.asarray(x)
        return (
            x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) or x.dtype.name == "bfloat16" else x
        )

    def dtype(self, name):
        return self.jnp.dtype(name)

    def vjp(self, fn, x, dy):
        y, pullback = self.jax.vjp(fn, x)
        (dx,) = pullback(dy)
        return y, dx

    def clear_caches(self):
        """Drop traced functions, so a call plans again (after a test changes
        what core_triton plans)."""
        self.jax.clear_caches()

    def vjp_many(self, fn, inputs: dict, cotangents):
        """(fn(**inputs), {name: gradient}) for an fn returning a tuple,
        pulled back from the tuple ``cotangents``."""
        outs, pullback = self.jax.vjp(lambda d: fn(**d), inputs)
        (grads,) = pullback(tuple(cotangents))
        return outs, grads
