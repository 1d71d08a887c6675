"""What one sandboxed tool call costs the machine, through each launcher (`envs/runtimes/launcher.py`).

    python -m benchmarks.sandbox_cost                    # 40 calls of `printf ... && ls` per launcher, interleaved
    python -m benchmarks.sandbox_cost --calls 100 --command true --out outputs/sandbox_cost.json

Each call is a fresh sandbox (`make_sandbox`: bubblewrap where it runs, as root with its per-command cgroups). The
launcher inside it is either the shell one (`prlimit` + bash, the default for ordinary commands) or the Python one
(`sys.executable -I -S`, what long or NUL-carrying commands use), forced here by patching the choice. Per call: wall
time, and machine CPU time (busy jiffies of every core from /proc/stat over the calls: the sandbox's processes, bwrap,
the launcher and the caller's threads together, as other work on the machine would feel them). Rounds alternate the
launchers so that drift hits both; the medians over rounds are printed and written as JSON. On agentic workloads
the rollout side's sandboxes share the cores with an overlapped learner, so this CPU is what they take from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from trl_thundersync.envs.runtimes import launcher, make_sandbox

from .affinity import busy_cpu_seconds

LAUNCHERS = ("shell", "python")


@contextmanager
def forced(which: str):
    """Every command through the `which` launcher ("shell" needs prlimit and bash here)."""
    if which == "shell" and not launcher.shell_launcher_available():
        raise SystemExit("no /usr/bin/prlimit or bash >= 4.1 on this host: only the Python launcher runs here")
    original = launcher.shell_launcher_argv
    if which == "python":
        launcher.shell_launcher_argv = lambda *args, **kwargs: None
    try:
        yield
    finally:
        launcher.shell_launcher_argv = original


def measure(calls: int, rounds: int, command: str) -> dict:
    workspace = Path(tempfile.mkdtemp(prefix="ts-sandbox-cost-"))
    (workspace / "README.md").write_text("benchmark workspace\n")
    sandbox = make_sandbox(workspace)
    per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in LAUNCHERS}
    outputs = {}
    for _ in range(rounds):
        for name in LAUNCHERS:
            with forced(name):
                outputs[name] = sandbox.run(command)  # warm-up, and the output both must agree on
                start_busy, start = busy_cpu_seconds(), time.perf_counter()
                for _ in range(calls):
                    sandbox.run(command)
                wall, cpu = time.perf_counter() - start, busy_cpu_seconds() - start_busy
            per_round[name].append((wall / calls, cpu / calls))
    same = (outputs["shell"].stdout, outputs["shell"].exit_code) == (outputs["python"].stdout,
                                                                     outputs["python"].exit_code)
    return dict(backend=type(sandbox).__name__, command=command, calls=calls, rounds=rounds, same_output=same,
                wall_ms={n: 1e3 * statistics.median(w for w, _ in r) for n, r in per_round.items()},
                machine_cpu_ms={n: 1e3 * statistics.median(c for _, c in r) for n, r in per_round.items()})


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="calls per launcher and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--command", default="printf 'step 1 traj 2 turn 0\\n' && ls",
                        help="the command (default: the scripted benchmark's tool call, without its sleep)")
    parser.add_argument("--out", default="sandbox_cost.json")
    args = parser.parse_args(argv)
    result = measure(args.calls, args.rounds, args.command)
    print(f"{result['backend']}: {args.calls} calls x {args.rounds} rounds of {args.command!r} "
          f"(same output through both launchers: {result['same_output']}); medians per call:")
    for name in LAUNCHERS:
        wall, cpu = result["wall_ms"][name], result["machine_cpu_ms"][name]
        print(f"  {name:<7} wall {wall:6.1f} ms   machine CPU {cpu:6.1f} ms")
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
