"""The benchmark workload: an agentic GRPO job whose rollout/learner balance and duration spread are knobs.

Every schedule of a benchmark point runs exactly this workload:

- model: the tiny offline Qwen3 (`trl_thundersync.tiny.model`) at `hidden` × `layers` — its per-trajectory forward
  + backward is the learner-side cost;
- data: `batch / group` chat prompts per step (TRL's sampler, fixed seed), `group` trajectories each;
- environment: `ShellBenchEnv`, a TRL `environment_factory` environment whose one tool `run_shell(command)` runs a
  real command in the bubblewrap sandbox (`envs.runtimes.make_sandbox` on a private temp workspace); its reward is
  a deterministic hash of everything the trajectory ran and saw, so GRPO advantages are non-zero;
- agent: `ScriptedTurnGenerator` actions — `turns` tool calls `sleep <d> && printf ... &&
  ls`, then a final answer. d = `latency_mean` × m_i × j_it: m_i ~ LogNormal(mean 1, CV `latency_cv`) per
  trajectory (the trajectory-duration spread), j_it ~ LogNormal(mean 1, CV `turn_jitter`) per turn, both seeded by
  (seed, step, trajectory[, turn]) so every schedule sees identical trajectories, latencies and rewards. Optional
  `gen_delay` seconds of simulated decode per turn. At most `concurrency` trajectories are in flight (rollout slots),
  so a batch runs in about batch / concurrency waves;
- reward scope: `reward_scope` is passed to the ThunderSync schedules (stock TRL always calls once per batch);
- grading: with `grading_latency` > 0 the environment's `get_reward()` verifies for g_i = `grading_latency` × k_i
  seconds after the trajectory's last turn (as SWE tasks run their tests) before returning the hash reward;
  k_i ~ LogNormal(mean 1, CV `grading_cv`), seeded per (seed, step, trajectory). Its own, narrower spread: a test
  suite takes about as long whatever the agent did, and with the tool-latency CV (0.6) one of 32 trajectories
  grades 5× the mean, so grading, not the agent, would define R. Grading runs as if in the background from the
  end of the last turn: `get_reward` sleeps until (end of the last tool call + the last turn's decode delay + g_i),
  so trainers that grade one trajectory at a time (ThunderSync's scoring thread, TRL's environment-reward loop) do
  not add the g_i up.
  Every schedule sees the same g_i, and R (last reward known) includes the last trajectory's grading;

Balance ρ = L/R is set by `latency_mean`; `bench.calibration` picks it from a measured learner cost per
trajectory and a measured per-trajectory rollout overhead, by replaying the seeded durations through the slots.
"""

from __future__ import annotations

import atexit
import hashlib
import math
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Workload:
    """One benchmark point. Times in seconds."""

    name: str = "point"
    seed: int = 0
    steps: int = 4  # optimizer steps per run; the first is dropped as warm-up
    batch: int = 16  # trajectories per optimizer step (B)
    group: int = 4  # GRPO group size (G)
    turns: int = 2  # tool calls per trajectory (scripted agent), followed by one answer turn
    concurrency: int = 4  # trajectories in flight at once (rollout slots: the agent engine's trajectory pool)
    latency_mean: float | None = None  # mean sandboxed sleep per tool call; None: calibrated from `balance`
    latency_cv: float = 0.5  # coefficient of variation of a trajectory's total tool latency
    turn_jitter: float = 0.2  # coefficient of variation of each turn's share
    gen_delay: float = 0.0  # simulated decode seconds per turn (scripted agent)
    grading_latency: float = 0.0  # mean seconds of verification after a trajectory's last turn (get_reward)
    grading_cv: float = 0.25  # coefficient of variation of the grading time between trajectories
    reward_scope: str = "auto"  # ThunderSyncGRPOConfig.reward_scope of the ThunderSync schedules
    shared_prefix: bool | None = None  # sync/ThunderSync: True: a shared prefix for every group (min prompt tokens 1),
    # False: none, None: the config's default (groups with prompts of shared_prefix_min_prompt_tokens or more)
    batch_members: bool | None = None  # sync/ThunderSync: batch_group_members (None: the config's default, on)
    adaptive_turns: bool | None = None  # ThunderSync turn release: adaptive_turn_release (None: the config's, on)
    sandbox: bool = True  # False: each tool call sleeps its latency in-process and returns what the sandboxed command
    # prints (the same tokens), so the rollout side spends no CPU on sandboxes (isolates their share of the overlap)
    balance: float | None = 1.0  # target ρ = L/R used by calibration
    hidden: int = 256  # tiny model width
    layers: int = 4  # tiny model depth

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Workload:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown workload fields {sorted(unknown)}; known: {[f.name for f in fields(cls)]}")
        return cls(**data)

    def with_(self, **changes: Any) -> Workload:
        return replace(self, **changes)

    @property
    def max_completion_tokens(self) -> int:
        """A completion budget every trajectory fits in (actions + observations), for both trainers."""
        return 96 * (self.turns + 1) + 16


# --- seeded latencies --------------------------------------------------------------------------------------------


def _lognormal(rng: random.Random, cv: float) -> float:
    """A LogNormal draw with mean 1 and coefficient of variation `cv` (exactly 1 when cv = 0)."""
    if cv <= 0:
        return 1.0
    sigma2 = math.log1p(cv * cv)
    return rng.lognormvariate(-sigma2 / 2, math.sqrt(sigma2))


def trajectory_multiplier(w: Workload, step: int, index: int) -> float:
    """m_i: the trajectory's latency scale (mean 1, CV `latency_cv`), the same for every schedule."""
    return _lognormal(random.Random(f"bench|{w.seed}|{step}|{index}"), w.latency_cv)


def turn_shares(w: Workload, step: int, index: int) -> list[float]:
    """j_it: the per-turn jitter of trajectory `index` (mean 1, CV `turn_jitter`)."""
    return [_lognormal(random.Random(f"bench|{w.seed}|{step}|{index}|{t}"), w.turn_jitter) for t in range(w.turns)]


def tool_latency(w: Workload, step: int, index: int, turn: int) -> float:
    """Seconds the sandboxed command of (step, trajectory, turn) sleeps."""
    mean = w.latency_mean or 0.0
    return mean * trajectory_multiplier(w, step, index) * turn_shares(w, step, index)[turn]


def trajectory_latency_units(w: Workload, step: int) -> list[float]:
    """Σ_t m_i·j_it per trajectory of a step: its total tool latency in units of `latency_mean`."""
    return [trajectory_multiplier(w, step, i) * sum(turn_shares(w, step, i)) for i in range(w.batch)]


def grading_seconds(w: Workload, step: int, index: int) -> float:
    """g_i: seconds the grading of (step, trajectory) takes after its last turn (mean `grading_latency`, CV
    `grading_cv`), the same for every schedule."""
    if w.grading_latency <= 0:
        return 0.0
    return w.grading_latency * _lognormal(random.Random(f"bench-grade|{w.seed}|{step}|{index}"), w.grading_cv)


def decode_seconds(w: Workload, step: int, index: int, turn: int) -> float:
    """Simulated decode time of one turn (`gen_delay` with the turn jitter), 0 without `gen_delay`."""
    if w.gen_delay <= 0:
        return 0.0
    return w.gen_delay * _lognormal(random.Random(f"bench-gen|{w.seed}|{step}|{index}|{turn}"), w.turn_jitter)


SCHEDULE_NAMES = ("sync", "thundersync", "trl")  # plus "thundersync:<release>" for each GRPO release point


def split_schedule(name: str) -> tuple[str, str]:
    """A benchmark schedule name → (trainer schedule, release point): "thundersync:content" → ("thundersync",
    "content"); "thundersync" is reward release (the paper), "sync" and "trl" have none (reported as "reward")."""
    schedule, _, release = name.partition(":")
    if schedule not in SCHEDULE_NAMES or (release and schedule != "thundersync"):
        raise ValueError(f"unknown schedule {name!r}: use sync, thundersync, thundersync:<release> or trl")
    return schedule, release or "reward"


_TRAJECTORY_KEY = re.compile(r"traj %d turn %d\\n' (\d+) (\d+) (\d+)")  # command_for's printf arguments
_COMMAND = re.compile(r"sleep ([0-9.]+) && printf 'step %d traj %d turn %d\\n' (\d+) (\d+) (\d+) && ls")


def command_for(w: Workload, step: int, index: int, turn: int) -> str:
    """The real command of one tool call: a seeded sleep and a little real work."""
    return (f"sleep {tool_latency(w, step, index, turn):.4f} && "
            f"printf 'step %d traj %d turn %d\\n' {step} {index} {turn}"
            " && ls")


# --- environment ----------------------------------------------------------------------------------------------------


_WORKSPACES: list[Path] = []


@atexit.register
def _remove_workspaces() -> None:
    for path in _WORKSPACES:
        shutil.rmtree(path, ignore_errors=True)


class ShellBenchEnv:
    """A TRL `environment_factory` environment: one sandboxed shell tool and a deterministic reward.

    `workload` (a class attribute, set by `env_factory`) gives the grading latency; the trajectory's (step, index)
    is read off the commands it ran (`command_for`)."""

    workload: Workload | None = None

    def __init__(self) -> None:
        from trl_thundersync.envs.runtimes import make_sandbox
        from trl_thundersync.envs.runtimes.api import SandboxLimits

        workspace = Path(tempfile.mkdtemp(prefix="ts-bench-ws-"))
        _WORKSPACES.append(workspace)
        (workspace / "README.md").write_text("benchmark workspace\n")
        (workspace / "data.txt").write_text("1 2 3\n")
        self.workspace = workspace
        sandboxed = self.workload is None or self.workload.sandbox
        self.sandbox = make_sandbox(workspace, SandboxLimits(timeout_s=120.0, cpu_time_s=60)) if sandboxed else None
        self.transcript: list[str] = []
        self._key: tuple[int, int] | None = None  # (step, trajectory index) of the episode
        self._last_tool_end = 0.0

    def reset(self, **row) -> str | None:
        self.transcript = [str(row.get("prompt", ""))]
        self._key = None
        return None

    def run_shell(self, command: str) -> str:
        """Run a shell command in the sandboxed task workspace and return its exit code and output.

        Args:
            command: The shell command to run.
        """
        if self.sandbox is None:
            observation = self._in_process(command)
        else:
            result = self.sandbox.run(command)
            observation = f"exit code: {result.exit_code}\n{result.stdout}{result.stderr}"
        self.transcript.append(command + "\n" + observation)
        key = _TRAJECTORY_KEY.search(command)
        if key is not None:
            self._key = (int(key.group(1)), int(key.group(2)))
        self._last_tool_end = time.perf_counter()
        return observation

    def _in_process(self, command: str) -> str:
        """`Workload.sandbox=False`: what `command_for`'s command prints, after its sleep, without a sandbox."""
        match = _COMMAND.fullmatch(command)
        if match is None:
            raise ValueError(f"not a benchmark command (sandbox=False runs only command_for's): {command!r}")
        time.sleep(float(match.group(1)))
        listing = "".join(f"{name}\n" for name in sorted(p.name for p in self.workspace.iterdir()))
        return f"exit code: 0\nstep {match.group(2)} traj {match.group(3)} turn {match.group(4)}\n{listing}"

    def _grading_deadline(self) -> float | None:
        w = self.workload
        if w is None or w.grading_latency <= 0 or self._key is None:
            return None
        step, index = self._key
        return self._last_tool_end + decode_seconds(w, step, index, w.turns) + grading_seconds(w, step, index)

    def get_reward(self) -> float:
        """A hash of the trajectory in [0, 1): deterministic, different between trajectories of a group; with a
        grading latency, returned once the trajectory's grading is done (module docstring)."""
        deadline = self._grading_deadline()
        if deadline is not None:
            time.sleep(max(0.0, deadline - time.perf_counter()))
        digest = hashlib.sha256("\x00".join(self.transcript).encode()).digest()
        return int.from_bytes(digest[:4], "big") / 2**32


def env_factory(w: Workload) -> type[ShellBenchEnv]:
    """The `environment_factory` of workload `w`: `ShellBenchEnv` (same name, so the same reward column) grading
    with `w.grading_latency`."""
    return type("ShellBenchEnv", (ShellBenchEnv,), {"workload": w, "__doc__": ShellBenchEnv.__doc__})


def bench_dataset(n: int = 64):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Task {k}: inspect the workspace with the "
                                           "shell, then answer."}] for k in range(n)]})


def bench_script(w: Workload, step_fn: Callable[[], int]):
    """The scripted agent: `turns` sandboxed commands, then an answer; `step_fn()` gives the optimizer step."""
    from benchmarks.scripted import tool_call_text

    def script(index: int, turn: int, context: str) -> str:
        if turn < w.turns:
            return tool_call_text("run_shell", {"command": command_for(w, step_fn(), index, turn)})
        return f"Done: task finished after {w.turns} commands."

    return script


def bench_delay(w: Workload, step_fn: Callable[[], int]) -> Callable[[int, int], float] | None:
    """Simulated decode time per turn (`gen_delay` with the turn jitter), or None."""
    if w.gen_delay <= 0:
        return None

    def delay(index: int, turn: int) -> float:
        return decode_seconds(w, step_fn(), index, turn)

    return delay
