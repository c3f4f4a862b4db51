"""Helpers that the tests and the benchmarks share (as `apache_beam.testing`)."""
