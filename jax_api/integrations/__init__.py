"""Glue for model code written by others (optional dependencies, imported
only here): :mod:`jax_api.integrations.flax`."""
