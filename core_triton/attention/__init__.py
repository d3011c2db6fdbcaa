"""Softmax attention: flash attention (plan, forward and backward kernels) and
the ring's plans."""
