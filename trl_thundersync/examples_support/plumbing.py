"""Plumbing of the example scripts: CPU-friendly defaults, the offline tiny models, a clean distributed exit."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def chosen_suite(default: str, argv: list[str] | None = None) -> str:
    """The `--suite` given on the command line (read before the full parse, for defaults that depend on it, such as
    the output folder), else `default`."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--suite", default=default)
    return parser.parse_known_args(argv)[0].suite


def set_script_defaults(parser, **defaults: Any) -> None:
    """Defaults applied before parsing, so a script runs with no arguments: on a machine without CUDA it trains on
    the CPU in FP32 (TRL's GRPOConfig defaults to bf16, which a CPU run refuses), plus the script's own defaults.
    Command-line flags and `--config` files still override all of them."""
    if not torch.cuda.is_available():
        defaults = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, **defaults}
    parser.set_defaults(**defaults)


def resolve_model(name: str | None, tiny_dir: str = "tiny-qwen3", args=None) -> str:
    """`tiny` (or nothing) → the offline random-weight tiny model under `tiny_dir`; `tiny-agent` → the tiny model
    warm-started to call tools (built once, under a minute on two cores, with a progress bar); a suite's
    `Suite.tiny_agent` name (`tiny-agent-lookup`, `tiny-agent-thermostat`, ...) → the tiny agent warm-started on that
    suite too (`Suite.warm_start()`: the lookup one 128 wide, 4-6 minutes; the thermostat one about a minute on two
    cores); anything else is returned unchanged. `args` (the run's TrainingArguments): under a multi-process launch
    the local main process builds the folder, showing progress, while the other processes wait and then reuse it."""
    from ..envs.suites import registered_suites

    if name in (None, "", "tiny"):
        from ..tiny.model import save_tiny_model

        return _build_once(args, lambda progress: save_tiny_model(tiny_dir))
    if name == "tiny-agent":
        from ..tiny.agent import save_tiny_agent_model

        return _build_once(args, lambda progress: save_tiny_agent_model(tiny_dir, progress=progress))
    suite = next((s for s in registered_suites() if s.tiny_agent is not None and name == s.tiny_agent), None)
    if suite is not None:
        from ..tiny.agent import save_tiny_agent_model

        warm = suite.warm_start()
        return _build_once(args, lambda progress: save_tiny_agent_model(tiny_dir, progress=progress, suite=warm))
    return name


def _build_once(args, build: Callable[[bool], Path]) -> str:
    """`build(progress)` on the local main process first (the others then find the folder built), progress shown
    there only; without `args` (or with one process) just `build(True)`."""
    if args is None or getattr(args, "world_size", 1) <= 1:
        return str(build(True))
    with args.main_process_first(local=True, desc="building the offline tiny model"):
        return str(build(args.local_process_index == 0))


def finish_distributed() -> None:
    """Tear down torch.distributed cleanly (a leftover process group can abort the interpreter's exit)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def resolve_teacher(name: str | None, tiny_dir: str = "tiny-agent-teacher", args=None) -> str:
    """The teacher of the distillation examples: `tiny-agent` (or nothing) → a second tool-calling tiny agent,
    warm-started with another seed (built once, under a minute on two cores); `tiny` → a random-weight tiny
    teacher, wider and deeper than the tiny student; anything else is returned unchanged. All share the student's
    tokenizer. `args`: as for `resolve_model`."""
    if name in (None, "", "tiny-agent"):
        from ..tiny.agent import save_tiny_agent_model

        return _build_once(args, lambda progress: save_tiny_agent_model(tiny_dir, seed=1, progress=progress))
    if name == "tiny":
        from ..tiny.model import save_tiny_model

        return _build_once(args, lambda progress: save_tiny_model(tiny_dir, hidden_size=96, num_layers=3, seed=7))
    return name
