"""Linear attention: recurrent, chunk-parallel and lightning; their plans,
forward kernels (``*_fwd*``) and backward kernels (``*_bwd*``)."""
