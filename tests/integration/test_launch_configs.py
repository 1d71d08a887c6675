"""The accelerate launch configurations in `configs/` (issue 13 item 4), launched as a user launches them.

Every accelerate config (a `configs/*.yaml` with a `distributed_type`; the others are `--config` files of the
example scripts) starts with three comment lines: what it is, `# launch: accelerate launch --config_file
configs/<it> examples/<script>.py`, and `# cpu: yes` or `# cpu: no — <why>`. Each `cpu: yes` file is launched here
with the toy example for 2 steps; files added later (ZeRO, FSDP2) are picked up by the glob.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fixtures.launch import free_port, run_together

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LAUNCH_LINE = re.compile(r"^# launch: accelerate launch --config_file (\S+) (?:.* )?(examples/\S+\.py)\b")


def launch_configs() -> list[Path]:
    """The accelerate configs of `configs/` (a `distributed_type` key; script configs have none)."""
    return sorted(p for p in (ROOT / "configs").glob("*.yaml")
                  if "distributed_type" in (yaml.safe_load(p.read_text()) or {}))


def header(path: Path) -> tuple[str, str, str]:
    """The first three lines of `path`, each without its `# `."""
    lines = path.read_text().splitlines()[:3]
    assert len(lines) == 3 and all(line.startswith("# ") for line in lines), f"{path.name}: no 3-line header"
    return tuple(lines)


def runs_on_cpu(path: Path) -> bool:
    return header(path)[2] == "# cpu: yes"


def accelerate_launch(config: Path, script: str, *args: str, timeout: int = 600) -> tuple[str, float]:
    """`accelerate launch --config_file <config> <script> <args>` from the repository root; (stdout, seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TRL_EXPERIMENTAL_SILENCE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
           "--main_process_port", str(free_port()), str(ROOT / script), *args]
    started = time.perf_counter()
    (done,) = run_together([cmd], env=env, cwd=str(ROOT), timeout=timeout)
    assert done.returncode == 0, f"{config.name}: exit {done.returncode}\n{done.stderr[-4000:]}"
    return done.stdout, time.perf_counter() - started


def test_there_are_launch_configs_and_cpu_ones():
    names = {p.name for p in launch_configs()}
    assert {"ddp.yaml", "two_node.yaml"} <= names
    assert "ddp.yaml" in {p.name for p in launch_configs() if runs_on_cpu(p)}


@pytest.mark.parametrize("config", launch_configs(), ids=lambda p: p.name)
def test_config_header_names_its_launch_command(config):
    what, launch, cpu = header(config)
    assert len(what) > 10, f"{config.name}: the first line says what the config is"
    match = LAUNCH_LINE.match(launch)
    assert match, f"{config.name}: second line is not '# launch: accelerate launch --config_file ...': {launch!r}"
    assert match.group(1) == f"configs/{config.name}", f"{config.name}: the launch line names {match.group(1)}"
    assert (ROOT / match.group(2)).is_file(), f"{config.name}: {match.group(2)} does not exist"
    assert cpu == "# cpu: yes" or re.match(r"^# cpu: no — \S.{8,}", cpu), f"{config.name}: bad cpu line {cpu!r}"


@pytest.mark.parametrize("config", [p for p in launch_configs() if runs_on_cpu(p)], ids=lambda p: p.name)
def test_cpu_config_launches_the_toy_example(config, tmp_path):
    """Every process of the launch trains 2 steps (each prints its `done:` line); the main one prints the summary."""
    stdout, _ = accelerate_launch(config, "examples/toy_grpo.py", "--config", "configs/toy_grpo.yaml",
                                  "--max_steps", "2", "--output_dir", str(tmp_path / "out"),
                                  "--tiny_model_dir", str(tmp_path / "tiny"), "--disable_tqdm", "true")
    processes = yaml.safe_load(config.read_text()).get("num_processes", 1)
    assert stdout.count("done: 2 optimizer steps, policy version 2") == processes, stdout[-3000:]
    assert stdout.count("run summary: 2 optimizer steps") == 1, stdout[-3000:]


def test_swe_example_under_ddp_config(tmp_path, tiny_agent):
    """The SWE example (tools in the sandbox, the embedded rollout server started by rank 0 and shared) under
    `configs/ddp.yaml`: two processes, 2 steps (about 30 s here with the tiny agent built)."""
    stdout, _ = accelerate_launch(ROOT / "configs" / "ddp.yaml", "examples/swe_grpo.py", "--model_name_or_path",
                                  tiny_agent, "--max_steps", "2", "--output_dir", str(tmp_path),
                                  "--disable_tqdm", "true")
    assert stdout.count("done: 2 optimizer steps on") == 2, stdout[-3000:]
    assert stdout.count("run summary: 2 optimizer steps") == 1, stdout[-3000:]
