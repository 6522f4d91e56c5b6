"""Correctness: test cases, checks against the references, the static check and the GPU
validation record."""
