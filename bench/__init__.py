"""Benchmarks: scripts that measure amptrain and print side-by-side ratios (see README, "Development")."""
