#!/usr/bin/env bash
# The whole GPU check in one command (device machines have no network):
# install the carried wheels (.whl: jax-triton, fla-core), run the test suite
# on the GPU (JAX through jax-triton), then the benchmarks.
# Usage: bash gpu_run.sh [OUTDIR]
set -u
out=${1:-${OUT:-gpu-results}}
mkdir -p "$out"
rm -rf .gpu-site && python3 -m pip install -q --no-index --no-deps --target .gpu-site .whl/*.whl
export PYTHONPATH=$PWD/.gpu-site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# The device machine has no writable default cache dir for Triton.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.triton-cache}
{
  nvidia-smi -L
  python3 -c "import jax, jax_triton, triton, torch; print('jax', jax.__version__, jax.devices()); print('jax-triton', jax_triton.__version__, 'triton', triton.__version__, 'torch', torch.__version__)"
} 2>&1 | tee "$out/env.log"
timeout "${TESTS_TIMEOUT:-330}" python3 -m pytest tests -q -p no:cacheprovider --maxfail=30 -W ignore::DeprecationWarning 2>&1 | tee "$out/tests.log"
python3 demo.py 2>&1 | tee "$out/demo.log"
TWINKERNELS_BENCH_DIR="$out" timeout "${BENCH_TIMEOUT:-200}" python3 -m bench ${BENCH:-} 2>&1 | tee "$out/bench.log"
