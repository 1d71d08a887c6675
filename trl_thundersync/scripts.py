"""Shared plumbing of the example scripts: CPU-friendly defaults and the offline tiny model.

Kept in the package (not in `examples/`) so that `python examples/x.py` and `accelerate launch examples/x.py`
import it the same way.
"""

from __future__ import annotations

from typing import Any

import torch


def set_script_defaults(parser, **defaults: Any) -> None:
    """Defaults applied before parsing, so a script runs with no arguments: on a machine without CUDA it trains on
    the CPU in FP32 (TRL's GRPOConfig defaults to bf16, which a CPU run refuses), plus the script's own defaults.
    Command-line flags and `--config` files still override all of them."""
    if not torch.cuda.is_available():
        defaults = {"use_cpu": True, "bf16": False, "gradient_checkpointing": False, **defaults}
    parser.set_defaults(**defaults)


def resolve_model(name: str | None, tiny_dir: str = "tiny-qwen3") -> str:
    """`tiny` (or nothing) → the offline random-weight tiny model under `tiny_dir`; `tiny-agent` → the tiny model
    warm-started to call tools (built once, about a minute on two cores); anything else is returned unchanged."""
    if name in (None, "", "tiny"):
        from .testing.tiny import save_tiny_model

        return str(save_tiny_model(tiny_dir))
    if name == "tiny-agent":
        from .testing.tiny_agent import save_tiny_agent_model

        print(f"preparing the tiny agent model in {tiny_dir} (first run only)", flush=True)
        return str(save_tiny_agent_model(tiny_dir))
    return name


def finish_distributed() -> None:
    """Tear down torch.distributed cleanly (a leftover process group can abort the interpreter's exit)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def resolve_teacher(name: str | None, tiny_dir: str = "tiny-agent-teacher") -> str:
    """The teacher of the distillation examples: `tiny-agent` (or nothing) → a second tool-calling tiny agent,
    warm-started with another seed (built once, about a minute on two cores); `tiny` → a random-weight tiny teacher,
    wider and deeper than the tiny student; anything else is returned unchanged. All share the student's tokenizer."""
    if name in (None, "", "tiny-agent"):
        from .testing.tiny_agent import save_tiny_agent_model

        print(f"preparing the tiny agent teacher in {tiny_dir} (first run only)", flush=True)
        return str(save_tiny_agent_model(tiny_dir, seed=1))
    if name == "tiny":
        from .testing.tiny import save_tiny_model

        return str(save_tiny_model(tiny_dir, hidden_size=96, num_layers=3, seed=7))
    return name
