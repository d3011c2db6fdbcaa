"""The test matrix and the other jobs.

nox -t tests        # the README's test command: lint + tests
nox -s tests        # both runs below in one environment (Triton interpreter
                    # on CPU; the interpreter takes torch tensors, so the JAX
                    # run needs torch CPU anyway)
nox -s tests_torch  # the PyTorch binding, in an environment without JAX, and
                    # tests/core (framework-free, and the PyTorch binding's parts)
nox -s tests_jax    # the JAX binding (interpreter via pure_callback), the tests
                    # of tests/core marked jax (its JAX binding's parts), both
                    # bindings together (tests/cross: DLPack hand-over,
                    # bit-identical outputs and gradients)
nox -s tests_cross  # tests/cross alone
nox -s lint         # ruff
nox -s demo         # the main job: both frameworks on the same kernels
nox -s gpu          # whole suite on a CUDA machine, in the current environment
nox -s bench        # benchmarks on a CUDA machine, in the current environment
"""

import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

# The tested torch.  Without a CUDA GPU its CPU build (about 0.2 GB; PyPI's
# wheel is the CUDA one, several GB): the local wheel where pip's own
# configuration finds it (the CI machine), else PyTorch's CPU index.
TORCH = "torch==2.13.0"
TORCH_CPU = "torch==2.13.0+cpu"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _install(session, extras):
    if shutil.which("nvidia-smi"):
        session.install(TORCH)
    else:
        try:
            session.install(TORCH_CPU)
        except nox.command.CommandFailed:
            session.log(f"{TORCH_CPU} is not where pip looks; taking it from {CPU_INDEX}")
            session.install(TORCH_CPU, "--index-url", CPU_INDEX)
    session.install("-e", f".[{extras}]")


@nox.session(tags=["tests"])
def lint(session):
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


# The PyTorch binding's run: tests/core (framework-free, and its PyTorch
# parts; the parts that exercise the JAX binding are marked jax) and
# tests/torch.
# (--dist worksteal: a worker that runs out of tests takes the other's, so
# the run does not end on one worker's long tail.)
_XDIST = ("-n", "2", "--dist", "worksteal", "--durations=25")
_TORCH_RUN = ("pytest", *_XDIST, "-m", "not jax", "tests/core", "tests/torch")
# The JAX binding's run, and both bindings together (tests/cross: DLPack
# hand-over, bit-identical outputs and gradients, the README's examples):
# of tests/core only what exercises the JAX binding.
_JAX_RUN = ("pytest", *_XDIST, "-m", "jax or not core", "tests/core", "tests/jax", "tests/cross")


@nox.session(tags=["tests"])
def tests(session):
    """Both runs in one environment (CI time: one install of torch, JAX,
    flax and transformers instead of two).  tests/core/test_imports.py
    checks that each binding imports only its own framework."""
    _install(session, "jax,interpret,torch,test,flax,models")
    session.run(*_TORCH_RUN, *session.posargs)
    session.run(*_JAX_RUN, *session.posargs)


@nox.session
def tests_torch(session):
    """The PyTorch run in an environment without JAX."""
    _install(session, "torch,test,models")
    session.run(*_TORCH_RUN, *session.posargs)


@nox.session
def tests_jax(session):
    """The JAX run alone (flax and transformers: the integrations' tests
    and the README's examples)."""
    _install(session, "jax,interpret,test,flax,models")
    session.run(*_JAX_RUN, *session.posargs)


@nox.session
def tests_cross(session):
    _install(session, "jax,torch,test")
    session.run("pytest", "-n", "2", "--durations=10", "tests/cross", *session.posargs)


@nox.session
def demo(session):
    _install(session, "jax,torch")
    session.run("python", "demo.py")


@nox.session(python=False)
def gpu(session):
    """Run on a CUDA machine with torch, jax (CUDA) and jax-triton installed."""
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session(python=False)
def bench(session):
    """Run on a CUDA machine; writes bench-results/*.json and *.png."""
    session.run("python", "-m", "bench", *session.posargs)
