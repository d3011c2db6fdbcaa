"""Test setup: Triton's interpreter on machines without a CUDA GPU, and
outputs poisoned with NaN so that an element a kernel leaves unwritten shows.

Both variables must be set before triton is imported, hence here at the top.
"""

import os
import shutil
import subprocess


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
