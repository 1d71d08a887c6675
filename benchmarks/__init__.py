"""Benchmark scripts, run from a checkout (not part of the wheel): each prints a table and writes JSON.

    python -m benchmarks --preset quick          # ThunderSync vs sync vs stock TRL, trace replay (BENCHMARKS.md)
    python -m benchmarks.realgen                 # the agentic SWE workload with real generation
    python -m benchmarks.<name> --help           # exactness, seed_floor, schedules, turn_backward, server_overhead, ...

`parity.py` (stock TRL and ThunderSync side by side on identical batches), `scripted.py` (a scripted turn generator)
and `turns.py` (synthetic multi-turn trajectories, a seeded teacher) are shared with the tests, which import them from
here: nothing outside tests/ imports `tests`.
"""
