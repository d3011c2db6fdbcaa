#!/usr/bin/env bash
# The whole GPU check (device machines have no network): install the carried
# wheels (.whl: jax-triton, fla-core, pytest-xdist, execnet), then
#   PART=tests  the test suite on the GPU (JAX through jax-triton), 8 workers
#               (Triton compiles on the CPU; WORKERS=16 on the H100), each
#               given a contiguous share of the tests (--dist worksteal: a
#               JAX worker compiles a kernel once for the tests of one file,
#               not every worker every kernel), then the tests that need tens of
#               GB of GPU memory one after another, and the demo;
#   PART=bench  the benchmarks (BENCH="linear_attention attention" picks some);
#   PART=all    both (the default; more than one 10-minute device call);
#   PART=sanitize  compute-sanitizer memcheck over bad-cu_seqlens cases;
#   PART=compare   before/after timings against the tree in .before;
#   PART=trees     one probe (TREES_PROBE=module) on .before and on this tree;
#   PART=host      bench/probes/host_overhead.py and jaxlib's Triton kernel API;
#   PART=probe     the large-tile chunk cases launch by launch (bench/probes/launch_probe.py);
#   PART=warm      the delta_rule bench's compiles, fla's autotuning included, one
#                  process a case at once (timings discarded), for the cache save;
#   PART=paths     the flash forward through each binding's launch path, with
#                  Triton's ptxas and with another (bench.probes.launch_paths);
#   PART=gluon     the Gluon kernels' probes: the forward, the dK/dV and dQ
#                  kernels at several tiles, each
#                  beside the Triton kernels and checked first.
# Usage: [PART=...] bash gpu_run.sh [OUTDIR]
set -u
out=${1:-${OUT:-gpu-results}}
part=${PART:-all}
mkdir -p "$out"
rm -rf .gpu-site && python3 -m pip install -q --no-index --no-deps --target .gpu-site .whl/*.whl
export PYTHONPATH=$PWD/.gpu-site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# The device machine has no writable default cache dir for Triton.  Outside
# the checkout: the device tool resets ignored paths of the checkout between
# calls, while /tmp lasts as long as the machine stays warm.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/twinkernels-triton-cache}
mkdir -p "$TRITON_CACHE_DIR"
# Compiling is most of a GPU run's time (PyTorch's kernels; jax-triton keeps
# its own cache in memory).  What a call compiled is saved at its end
# (NO_SAVE_CACHE=1 to skip it) as standalone archives $out/triton-cache-NN.txz;
# copy them into .triton-cache-parts/ under new names (NAME.txz) and carry that
# folder to unpack them all first, oldest first by name (a later one's files
# replace an earlier one's).  Older saves split one archive into pieces
# (NAME.txz.part-aa, -ab, ...); those unpack too, when every piece is there.
# An archive is checked whole before it is unpacked: a truncated one (a part
# that did not come back) once left a cut cubin in the cache, which crashed
# the process that loaded it (a segfault in Triton's load_binary).
for first in .triton-cache-parts/*.txz.part-aa; do
  [ -e "$first" ] || continue
  if cat "${first%aa}"* | xz -t 2> /dev/null; then
    cat "${first%aa}"* | tar -xJf - -C "$TRITON_CACHE_DIR"
  else
    echo "skipping ${first%.part-aa}: incomplete archive" >&2
  fi
done
for archive in .triton-cache-parts/*.txz; do
  [ -e "$archive" ] || continue
  if xz -t "$archive" 2> /dev/null; then tar -xJf "$archive" -C "$TRITON_CACHE_DIR"; else echo "skipping $archive" >&2; fi
done
# Entries compiled from here on are the ones a call saves.
touch "$TRITON_CACHE_DIR/.unpacked"
{
  nvidia-smi -L
  python3 -c "import jax, jax_triton, triton, torch; print('jax', jax.__version__, jax.devices()); print('jax-triton', jax_triton.__version__, 'triton', triton.__version__, 'torch', torch.__version__)"
} 2>&1 | tee "$out/env.log"
if [ "$part" = tests ] || [ "$part" = all ]; then
  # JAX's pooling allocator keeps what a big test freed; the next big test
  # in the same worker (torch) would then run out of memory.
  # Tests that take tens of GB (marked xdist_group("gpu_memory")) run after
  # the rest, alone on the GPU: beside 15 busy workers one ran out of memory.
  # SKIP_MAIN=1 / SKIP_BIG=1 leave out one of the two halves (one device
  # call is at most 10 minutes).  DONE=<logs> (paths joined by ':') leaves
  # out the tests those logs (run with PYTEST_ARGS=-vv) show as passed: a
  # later call of the same commit goes on where a cut one stopped.
  # report*.txt: each test's outcome and seconds as it ends, and the
  # failures' tracebacks (report*.txt.failures): a call cut by its limit
  # prints no summary.  They serve as DONE logs too.
  [ -z "${DONE:-}" ] || export TWINKERNELS_DONE="$DONE"
  [ -n "${SKIP_MAIN:-}" ] || XLA_PYTHON_CLIENT_ALLOCATOR=platform TWINKERNELS_REPORT="$out/report.txt" timeout "${TESTS_TIMEOUT:-480}" python3 -m pytest ${TESTS:-tests} -q -p no:cacheprovider -n "${WORKERS:-8}" \
    -m "not xdist_group" --dist worksteal --maxfail=30 -W ignore::DeprecationWarning --durations=15 -rfE ${PYTEST_ARGS:-} 2>&1 | tee "$out/tests.log"
  [ -n "${SKIP_BIG:-}" ] || XLA_PYTHON_CLIENT_ALLOCATOR=platform TWINKERNELS_REPORT="$out/report-big.txt" timeout "${BIG_TESTS_TIMEOUT:-300}" python3 -m pytest ${TESTS:-tests} -q -p no:cacheprovider -p no:xdist \
    -m xdist_group -W ignore::DeprecationWarning --durations=5 -rfE --tb=short ${PYTEST_ARGS:-} 2>&1 | tee "$out/tests-big.log"
  [ -n "${SKIP_DEMO:-}" ] || timeout 300 python3 demo.py 2>&1 | tee "$out/demo.log"
fi
if [ "$part" = bench ] || [ "$part" = all ]; then
  TWINKERNELS_BENCH_DIR="$out" timeout "${BENCH_TIMEOUT:-540}" python3 -m bench ${BENCH:-} 2>&1 | tee "$out/bench.log"
fi
if [ "$part" = sanitize ]; then
  # compute-sanitizer's memcheck over bad-cu_seqlens cases (SANITIZE="fw:op:case ...").
  for c in ${SANITIZE:-torch:chunk:all_wild torch:chunk_split:all_wild torch:recurrent:all_wild torch:global_cumsum:last_past_seq_len}; do
    IFS=: read -r fw op case <<< "$c"
    echo "== compute-sanitizer memcheck: $fw $op $case"
    timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3 \
      python3 -m tests.packed_bounds "$fw" "$op" "$case" 2>&1 | tail -n 25
    echo "exit ${PIPESTATUS[0]}"
  done 2>&1 | tee "$out/sanitize.log"
fi
if [ "$part" = host ]; then
  # Where an eager call's host time goes (issue 13), and whether this jaxlib
  # can give Triton kernels global scratch (what the JAX binding needs for the
  # tensor-descriptor kernels): the constructor jax-triton calls.
  timeout "${HOST_TIMEOUT:-200}" python3 -m bench.probes.host_overhead 2>&1 | tee "$out/host_overhead.log"
  python3 -c "from jax._src.lib import gpu_triton as g; print(g.TritonKernel.__init__.__doc__); print([n for n in dir(g) if not n.startswith('__')])" 2>&1 | tee "$out/jaxlib_triton.log"
fi
if [ "$part" = paths ]; then
  # bench.probes.launch_paths: the flash forward through each launch path,
  # then again with PyTorch's compiles assembled by another ptxas (one on
  # PATH, else the nvidia-cuda-nvcc wheel's) in a fresh cache, to see
  # whether the assembler makes PyTorch's and JAX's times differ.
  timeout "${PATHS_TIMEOUT:-200}" python3 -m bench.probes.launch_paths 2>&1 | tee "$out/launch_paths.log"
  other=$(ls -1 $(python3 -c "import sys; print(' '.join(p + '/nvidia/cuda_nvcc/bin/ptxas' for p in sys.path))") $(command -v ptxas) 2> /dev/null | tail -n 1)
  if [ -n "$other" ]; then
    TRITON_PTXAS_PATH=$other TRITON_CACHE_DIR=$(mktemp -d) timeout "${PATHS_TIMEOUT:-200}" python3 -m bench.probes.launch_paths 2>&1 | tee "$out/launch_paths_other_ptxas.log"
  fi
fi
if [ "$part" = gluon ]; then
  # Each checks its kernels against a reference first, then times them beside
  # the plan's launches (bench.probes.gluon_flash, bench.probes.gluon_bwd).
  # GLUON_FLASH_MODULES picks the forwards (default: the library's); GLUON_BWD=0
  # leaves out the backward's probe.
  GLUON_FLASH_MODULES=${GLUON_FLASH_MODULES:-core} timeout "${GLUON_TIMEOUT:-240}" python3 -m bench.probes.gluon_flash 2>&1 | tee "$out/gluon_flash.log"
  [ "${GLUON_BWD:-1}" = 0 ] || timeout "${GLUON_TIMEOUT:-240}" python3 -m bench.probes.gluon_bwd 2>&1 | tee "$out/gluon_bwd.log"
fi
if [ "$part" = probe ]; then
  # The large-tile chunk cases that never finished on the GPU, launch by
  # launch (bench/probes/launch_probe.py), each alone under a timeout: the last
  # "launch" line without its "done" names the kernel that does not end.
  # PROBE="K CHUNK DTYPE REVERSE;..." picks other cases.
  cases=("128 128 bfloat16 1" "128 256 float32 0" "256 64 float32 1" "256 128 float32 0" "128 256 bfloat16 1" "256 256 float32 0")
  [ -z "${PROBE:-}" ] || IFS=';' read -ra cases <<< "$PROBE"
  for c in "${cases[@]}"; do
    echo "== K CHUNK DTYPE REVERSE = $c"
    timeout "${PROBE_TIMEOUT:-60}" python3 -m bench.probes.launch_probe $c 2>&1 | tail -n 8
    echo "exit ${PIPESTATUS[0]}"
  done 2>&1 | tee "$out/probe.log"
fi
if [ "$part" = warm ]; then
  # fla's autotuning compiles every config it tries (about 5 minutes a case
  # of bench/delta_rule.py on the H100, one case after another past a
  # device call's 10 minutes).  One process a case compiles them side by
  # side (the timings, disturbed, are thrown away); this call's cache save
  # keeps the binaries, and a PART=bench call that carries them autotunes
  # from cached builds (the whole delta_rule bench then took 4 minutes).
  cases=${WARM_CASES:-gdn-B1 gdn-B4 kda-B1 kda-B4}
  for c in $cases; do
    TWINKERNELS_BENCH_IMPLS=fla,torch TWINKERNELS_BENCH_ONLY=$c TWINKERNELS_BENCH_DIR=/tmp/warm-$c \
      timeout "${WARM_TIMEOUT:-480}" python3 -m bench delta_rule > "/tmp/warm-$c.log" 2>&1 &
  done
  wait
  for c in $cases; do echo "== $c"; cat "/tmp/warm-$c.log"; done > "$out/warm.log"
fi
if [ "$part" = trees ]; then
  # One probe module (TREES_PROBE, e.g. bench.probes.dkdv_runs, with its own
  # environment) on the tree in .before and on this one, alternating, in
  # TREES_ROUNDS rounds (default 2).  The first round's two processes
  # compile side by side (their timings disturbed, kept apart as warm-*.log);
  # waits name their process ids (a pattern match would also find this shell).
  root=$PWD
  on_tree() { ( cd "$root/$1" && PYTHONPATH="$root/.gpu-site:$root/$1" timeout "${TREES_TIMEOUT:-200}" python3 -m "$TREES_PROBE" 2>&1 ); }
  pids=()
  for t in .before .; do
    on_tree "$t" > "$out/warm-${#t}.log" &
    pids+=($!)
  done
  wait "${pids[@]}"
  for _ in $(seq "${TREES_ROUNDS:-2}"); do
    for t in .before .; do
      echo "== tree $t"
      on_tree "$t"
    done
  done 2>&1 | tee "$out/trees.log"
fi
if [ "$part" = compare ]; then
  # Kernel-bound cases on the tree in .before (an extracted git archive of
  # the old commit) and on this one, alternating (bench/probes/compare_trees.py).
  timeout "${COMPARE_TIMEOUT:-400}" python3 -m bench.probes.compare_trees .before 2>&1 | tee "$out/compare.log"
fi
if [ -z "${NO_SAVE_CACHE:-}" ]; then
  # What this call compiled (entries newer than the unpacking), newest first,
  # as standalone archives of at most ~160 MB of entries each (under 16 MB
  # compressed)
  # ($out/triton-cache-NN.txz): files come back up to 16 MiB each and a
  # total limit, so the oldest may not come back, and a missing one loses
  # only its own entries.  Copy them into .triton-cache-parts/ under new names.
  command -v xz > /dev/null || echo "SAVE_CACHE: no xz on this machine" >&2
  ( cd "$TRITON_CACHE_DIR" && find . -mindepth 1 -maxdepth 1 -newer .unpacked ! -name .unpacked -printf '%T@ %p\n' \
      | sort -rn | cut -d' ' -f2- | while read -r entry; do echo "$(du -sk "$entry" | cut -f1) $entry"; done \
      | awk '{ if (size + $1 > 163840 && size > 0) { n++; size = 0 } size += $1; print n + 0, $2 }' > /tmp/cache-groups )
  for n in $(cut -d' ' -f1 /tmp/cache-groups | sort -un); do
    awk -v n="$n" '$1 == n { print $2 }' /tmp/cache-groups \
      | tar -cf - -C "$TRITON_CACHE_DIR" -T - | xz -T0 -3 > "$out/triton-cache-$(printf %02d "$n").txz"
  done
  ls -l "$out"/triton-cache-*.txz 2> /dev/null
fi
