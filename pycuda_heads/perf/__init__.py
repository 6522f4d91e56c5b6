"""Performance: GPU timing, the benchmark and its PyTorch peers."""
