"""Pipeline-level helpers that the tests and the benchmarks share."""
