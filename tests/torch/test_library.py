from tests.suites.torch_library import CudaGraphSuite, TorchLibrarySuite


class TestTorchLibrary(TorchLibrarySuite):
    pass


class TestCudaGraphs(CudaGraphSuite):
    pass
