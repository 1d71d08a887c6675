"""The example scripts as a user runs them: out of the box on CPU, and schedule-independent results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def run_example(script, *args, launcher=(sys.executable,), timeout=600):
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([*launcher, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def sampled_shape(trace_dir: Path) -> list[tuple]:
    """Every trajectory and turn of a run's trace as (step, index, turn, tokens), sorted: two runs that sampled the
    same trajectories agree on it (the schedule changes timings, never what was sampled)."""
    rows = []
    for line in (trace_dir / "steps.jsonl").read_text().splitlines():
        step = json.loads(line)
        rows += [(step["step"], e["index"], e["turn"], e["tokens"]) for e in step["events"]
                 if e["lane"] == "rollout" and e["kind"] in ("trajectory", "turn")]
    return sorted(rows)


def run_swe_schedules(tmp_path: Path, tiny_agent: str) -> tuple[dict, dict]:
    weights, shapes = {}, {}
    for schedule in ("sync", "thundersync"):
        out = tmp_path / schedule
        stdout = run_example("swe_grpo.py", "--model_name_or_path", tiny_agent, "--max_steps", "2", "--schedule",
                             schedule, "--output_dir", str(out), "--learning_rate", "1e-2", "--optim", "sgd",
                             "--disable_tqdm", "true")
        assert "done: 2 optimizer steps" in stdout
        weights[schedule] = load_file(str(out / "model.safetensors"))
        lines = (out / "thundersync_trace" / "steps.jsonl").read_text().splitlines()
        assert len(lines) == 2
        assert '"lane": "tool"' in lines[0] + lines[1], "the agent must really call tools"
        shapes[schedule] = sampled_shape(out / "thundersync_trace")
    return weights, shapes


def test_swe_example_schedules_give_identical_parameters(tmp_path, tiny_agent):
    weights, shapes = run_swe_schedules(tmp_path / "attempt-1", tiny_agent)
    for attempt in (2, 3):
        if shapes["sync"] == shapes["thundersync"]:
            break
        # The trajectories differ: the sandboxed commands the tiny agent samples run real programs, and a command
        # whose output depends on the wall clock (a timestamp, a timeout, a duration) changes what the model sees
        # next. That is the environment, not the schedule; run the pair again (on a loaded 2-core machine two
        # pairs in a row were seen to differ, once in three full suite runs), then it must hold.
        print(f"the two runs sampled different trajectories; running the pair again: {shapes}")
        weights, shapes = run_swe_schedules(tmp_path / f"attempt-{attempt}", tiny_agent)
    assert shapes["sync"] == shapes["thundersync"], "the two schedules sampled different trajectories three times"
    initial = load_file(str(Path(tiny_agent) / "model.safetensors"))
    names = sorted(initial)
    flat = {k: torch.cat([w[n].reshape(-1) for n in names]) for k, w in weights.items()}
    moved = flat["sync"] - torch.cat([initial[n].reshape(-1) for n in names])
    assert moved.norm() > 0, "training must move the weights"
    # Same trajectories (seeded per step/trajectory/turn; checked above from the traces); the accumulation order
    # follows tool timing, so the two updates agree up to FP32 summation order (SGD: linear in the gradient, no Adam
    # amplification of rounding). The difference is measured against the (small) displacement, while FP32 rounds
    # the parameters themselves: one ulp of a weight is ~1e-7 of its value, so the bound is 1e-4 of the
    # displacement. A single differently sampled token would move the weights by orders of magnitude more.
    assert float((flat["sync"] - flat["thundersync"]).norm() / moved.norm()) <= 1e-4


def test_terminal_example_runs_under_accelerate_launch(tmp_path, tiny_agent):
    launcher = (sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu",
                "--mixed_precision", "no", "--dynamo_backend", "no")
    stdout = run_example("swe_grpo.py", "--suite", "terminal", "--model_name_or_path", tiny_agent, "--max_steps", "2",
                         "--output_dir", str(tmp_path), launcher=launcher)
    assert "done: 2 optimizer steps" in stdout


def test_toy_example_with_its_config(tmp_path):
    stdout = run_example("toy_grpo.py", "--config", "configs/toy_grpo.yaml", "--max_steps", "2", "--output_dir",
                         str(tmp_path), "--tiny_model_dir", str(tmp_path / "tiny"))
    assert "done: 2 optimizer steps" in stdout


def test_quickstart_example_ends_with_its_learning_summary_and_plot(tmp_path, tiny_agent) -> None:
    """The quickstart job end to end on the thermostat suite (2 steps, the session's tiny agent instead of the
    thermostat build, one held-out episode per task): it trains, evaluates the held-out split before and after,
    prints the learning summary and writes the reward-versus-time plot."""
    stdout = run_example("thermostat_grpo.py", "--model_name_or_path", tiny_agent, "--max_steps", "2",
                         "--per_device_train_batch_size", "4", "--num_generations", "2", "--eval_samples", "1",
                         "--max_completion_length", "96", "--output_dir", str(tmp_path), "--disable_tqdm", "true")
    assert "done: 2 optimizer steps on 16 thermostat tasks" in stdout and "learning: training reward" in stdout
    assert "held-out success: " in stdout and " before training -> " in stdout
    plot = tmp_path / "reward_vs_time.png"
    assert f"reward-versus-time plot: {plot}" in stdout and plot.stat().st_size > 0
