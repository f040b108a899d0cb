"""pymq benchmarks: run with `python -m benchmarks.<name>`; see README.md."""
