"""Glue for model code written by others (optional dependencies, imported
only here): :mod:`torch_api.integrations.transformers`."""
