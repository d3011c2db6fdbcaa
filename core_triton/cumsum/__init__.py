"""Chunked cumulative sums: the two ops' plans and the scan kernel they share."""
