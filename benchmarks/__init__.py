"""Benchmarks of tensorgrad against PyTorch eager (run: python -m benchmarks.run)."""
