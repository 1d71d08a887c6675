"""Benchmark scripts: each prints a table and writes JSON (`python -m trl_thundersync.bench.<name> --help`)."""
