"""A probe for issue 15 (not part of ``nox -s bench``): does this Triton
emit warp-specialised code with register reallocation (``setmaxnreg``) for
sm_90 from Gluon's ``warp_specialize``?  ``tl`` code with
``warp_specialize=True`` loops got none from Triton 3.6 on sm_90; Gluon's
explicit partitions do (10 ``setmaxnreg``, measured with Triton 3.6), which
is the route to FlashAttention-3's producer/consumer warpgroups.  Compiles
offline, no GPU needed: ``python -m bench.probes.gluon_probe``."""

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource


@gluon.jit
def _scale(x_ptr, y_ptr, start: gl.constexpr, N: gl.constexpr, factor: gl.constexpr, warps: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [warps], [0])
    offs = start + gl.arange(0, N, layout=layout)
    gl.store(y_ptr + offs, gl.load(x_ptr + offs) * factor)


@gluon.jit
def _default(x_ptr, y_ptr, N: gl.constexpr):
    _scale(x_ptr, y_ptr, 0, N, 2.0, 4)


@gluon.jit
def _worker(x_ptr, y_ptr, N: gl.constexpr):
    _scale(x_ptr, y_ptr, N, N, 3.0, 1)


@gluon.jit
def ws_kernel(x_ptr, y_ptr, N: gl.constexpr):
    gl.warp_specialize([(_default, (x_ptr, y_ptr, N)), (_worker, (x_ptr, y_ptr, N))], [1], [40])


def main():
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "N": "constexpr"}
    src = GluonASTSource(ws_kernel, signature, constexprs={"N": 128})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = compiled.asm["ptx"]
    lines = [line.strip() for line in ptx.splitlines() if "setmaxnreg" in line]
    print(f"triton {triton.__version__}, sm_90: {len(lines)} setmaxnreg", lines[:4])


if __name__ == "__main__":
    main()
