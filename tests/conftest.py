"""Test setup: Triton's interpreter on machines without a CUDA GPU, and
outputs poisoned with NaN so that an element a kernel leaves unwritten shows.

Both variables must be set before triton is imported, hence here at the top.
"""

import os
import shutil
import subprocess
import sys


def _has_cuda_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


if "TRITON_INTERPRET" not in os.environ and not _has_cuda_gpu():
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TWINKERNELS_POISON", "1")
# Ring tests and shard_map tests want several CPU devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
# JAX would take 75% of a GPU's memory at start; torch shares the GPU here.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# torch.compile's on-disk caches key a graph on its ops and inputs, not on
# what our ops' fake implementations return: a graph compiled against an
# older checkout (an index array since grown) replayed its stale shape
# checks.  Each test process compiles afresh unless the user chose a dir.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import atexit
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="twinkernels-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


def _threads_per_worker() -> int:
    """CPU threads each test process may use: the cores shared among the
    xdist workers.  With torch's default (every core in every worker) 16
    workers on 16 cores ran the float64 references 10-100 times slower
    than alone (a K=32 reference: 0.3 s on one thread, 1.35 s on two
    threads of a busy 2-core machine)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // max(1, workers))


# Read by OpenMP/BLAS when torch and numpy load, so before anything imports
# them.  A count the user set stays; one this file set in xdist's controller
# (which the workers inherit) is replaced by each worker's share.
if "OMP_NUM_THREADS" not in os.environ or os.environ.get("TWINKERNELS_SET_THREADS") == "1":
    os.environ["TWINKERNELS_SET_THREADS"] = "1"
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(_threads_per_worker())


def _limit_torch_threads() -> None:
    # A plugin may have imported torch before this file ran.
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get("TWINKERNELS_SET_THREADS") == "1":
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """``TWINKERNELS_DONE=<file>``: leave out the tests that a file of
    pytest output (``-v`` or ``-vv`` lines with ``PASSED``) or a list of
    node ids (a file named ``*.ids``, one per line) names as passed, so
    that a GPU run cut by its time limit goes on where it stopped
    (gpu_run.sh passes the earlier calls' logs).  Only for runs of one
    commit: a result on other code proves nothing."""
    path = os.environ.get("TWINKERNELS_DONE")
    if not path:
        return
    done = set()
    for name in path.split(os.pathsep):
        if not os.path.exists(name):
            continue
        with open(name) as f:
            for line in f:
                # "[gw1] [ 10%] PASSED <id>" (xdist -vv), "<id> PASSED [ 9%]"
                # (-v), "PASSED <seconds> <id>" (TWINKERNELS_REPORT), or a
                # bare "<id>" in an .ids list.  Not a bare id in a log:
                # xdist -vv prints one when a test starts, passed or not.
                words = line.split()
                if "PASSED" in words or (name.endswith(".ids") and len(words) == 1):
                    done.update(w for w in words if "::" in w)
    kept = [item for item in items if item.nodeid not in done]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = kept


_report = {}


def _skip_nested_lang_patching() -> None:
    """Triton's interpreter patches ``triton.language`` for the interpreter
    when a kernel launches (and restores it when the grid is done), and
    again at every call of a jit device function from inside the kernel
    (``InterpretedFunction.__call__``), program after program: a
    re-patching of every builtin that the first such call already made.
    Chunk kernels call small helpers (dot, the gate and decay helpers) in
    loops; patching each set of modules once
    per launch took the chunk suite's test_matches_reference cases from
    38.5 to 30.9 s (one process).  Calls outside any launch keep
    Triton's own path.  Only where the interpreter's code is as expected."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    fn_cls, executor = getattr(interp, "InterpretedFunction", None), getattr(interp, "GridExecutor", None)
    if fn_cls is None or executor is None or not hasattr(interp, "_patch_lang"):
        return
    tl, core = interp.tl, interp.tl.core
    depth, patched, langs = [0], set(), {}
    launch, call = executor.__call__, fn_cls.__call__

    def launch_counted(self, *args, **kwargs):
        depth[0] += 1
        patched.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            depth[0] -= 1
            patched.clear()

    def device_call(self, *args, **kwargs):
        if not depth[0]:
            return call(self, *args, **kwargs)
        # Which language modules the function sees (triton.language, or its
        # core as Triton's own standard library does): each set is patched
        # once per launch, as Triton's first call of it would.
        key = langs.get(self.fn)
        if key is None:
            mods = self.fn.__globals__.values()
            key = langs[self.fn] = frozenset(id(m) for m in mods if m is tl or m is core)
        if key not in patched:
            interp._patch_lang(self.fn)
            patched.add(key)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    executor.__call__, fn_cls.__call__ = launch_counted, device_call


def pytest_configure(config):
    """``TWINKERNELS_REPORT=<file>``: each test's outcome and seconds, one
    line as it ends (``PASSED 1.23 <id>``), and each failure's traceback in
    ``<file>.failures``.  A GPU call cut by its time limit never prints
    pytest's summary; these files have what ran by then.  Written by the
    process that reports (xdist's controller), not by its workers."""
    _limit_torch_threads()
    _skip_nested_lang_patching()
    path = os.environ.get("TWINKERNELS_REPORT")
    if path and not hasattr(config, "workerinput"):
        _report["path"] = path


def pytest_runtest_logreport(report):
    path = _report.get("path")
    if path is None or not (report.when == "call" or report.outcome != "passed"):
        return
    if report.when == "teardown" and report.outcome == "skipped":
        return
    outcome = "ERROR" if report.when != "call" and report.failed else report.outcome.upper()
    with open(path, "a") as f:
        f.write(f"{outcome} {report.duration:.2f} {report.nodeid}\n")
    if report.failed:
        with open(path + ".failures", "a") as f:
            f.write(f"==== {outcome} ({report.when}) {report.nodeid}\n{report.longreprtext}\n\n")
