"""One-off measurements behind a design choice; ``python -m bench`` runs none
of them (each module says what it measured and how to run it)."""


def profiled_call(torch, call):
    """``call()`` twice (compiling, autotuning), then once inside a profiler
    range (``ncu --profile-from-start off`` sees that one only)."""
    call()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
