"""The benchmark scripts: each one a short program over benchmarks.harness (run as `python benchmarks/X.py`)."""
