"""What every family shares: launch descriptions, argument checks, the run-time
(compiled or interpreted), sequence bounds, fixed-order reductions, small ints."""
