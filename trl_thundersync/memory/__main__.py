"""Print the memory plan of a GRPO run for a Hugging Face model config, without loading any weight.

    python -m trl_thundersync.memory --model Qwen/Qwen3-8B-config-dir --per_device_train_batch_size 32 \\
        --num_generations 8 --dtype bfloat16 --lora_r 16
    python -m trl_thundersync.memory --model ./tiny-agent --config configs/thermostat_grpo.yaml

`--model`: a folder with a `config.json`, or the file itself; the parameter counts come from the model built on
PyTorch's meta device (no memory, no download). `--config`: a YAML trainer config (the fields below are read from
it; flags given on the command line win). The trainer prints the same plan at the start of a run and logs the
measured peak beside it (`thundersync/memory_plan_mb`, `thundersync/peak_memory_mb`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from .budget import choose_caps, parse_budget
from .plan import MemorySpec, plan_memory

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# trainer-config fields the plan reads, with ThunderSyncGRPOConfig's defaults where TRL's differ from none
FIELDS = {"per_device_train_batch_size": (int, 8), "gradient_accumulation_steps": (int, 1),
          "steps_per_generation": (int, None), "num_generations": (int, 8), "release": (str, "content"),
          "max_open_groups": (int, None), "max_buffered_trajectories": (int, None), "memory_budget": (str, "auto"),
          "beta": (float, 0.0), "optim": (str, "adamw_torch"), "schedule": (str, "thundersync")}


def parameter_counts(model_config: Path, lora_r: int | None) -> tuple[int, int]:
    """(all parameters, trainable parameters) of the model `model_config` describes, built on the meta device;
    with `lora_r`, the trainable ones are a rank-r adapter on every linear layer but the output head (PEFT's
    "all-linear")."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_config.parent if model_config.is_file() else model_config))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    if lora_r is None:
        return total, total
    head = model.get_output_embeddings()
    adapter = sum(lora_r * (m.in_features + m.out_features) for m in model.modules()
                  if isinstance(m, torch.nn.Linear) and m is not head)
    return total + adapter, adapter


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trl_thundersync.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="a model folder with config.json, or the file")
    parser.add_argument("--config", type=Path, help="a YAML trainer config to read the fields below from")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=None,
                        help="the parameters' dtype (default: the model config's, else float32)")
    parser.add_argument("--lora_r", type=int, default=None, help="plan a LoRA adapter of this rank (all-linear)")
    parser.add_argument("--sharded", action="store_true", help="ZeRO-3 / FSDP2 full shard (a replica per rank)")
    for name, (kind, _) in FIELDS.items():
        parser.add_argument(f"--{name}", type=kind, default=None)
    return parser.parse_args(argv)


def spec_from_args(args: argparse.Namespace) -> MemorySpec:
    given = yaml.safe_load(args.config.read_text()) or {} if args.config else {}
    value = {name: getattr(args, name) if getattr(args, name) is not None else given.get(name, default)
             for name, (_, default) in FIELDS.items()}
    steps = value["steps_per_generation"] or value["gradient_accumulation_steps"]
    total, trainable = parameter_counts(args.model, args.lora_r)
    dtype = args.dtype or _config_dtype(args.model)
    return MemorySpec(
        total_params=total, trainable_params=trainable, param_bytes=DTYPE_BYTES[dtype], optimizer=value["optim"],
        batch_size=value["per_device_train_batch_size"] * steps, num_generations=value["num_generations"],
        release=value["release"], max_open_groups=value["max_open_groups"],
        max_buffered_trajectories=value["max_buffered_trajectories"], beta=value["beta"],
        peft=args.lora_r is not None, sharded=args.sharded, micro_batches=steps)


def _config_dtype(model: Path) -> str:
    config = json.loads((model if model.is_file() else model / "config.json").read_text())
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return dtype if dtype in DTYPE_BYTES else "float32"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spec = spec_from_args(args)
    budget_field = args.memory_budget if args.memory_budget is not None else "auto"
    if args.config is not None and args.memory_budget is None:
        budget_field = (yaml.safe_load(args.config.read_text()) or {}).get("memory_budget", "auto")
    caps = choose_caps(spec, parse_budget(budget_field))
    plan = plan_memory(replace(spec, max_open_groups=caps.max_open_groups, release=caps.release,
                               max_buffered_trajectories=caps.max_buffered_trajectories))
    print(f"{args.model}: {spec.total_params:,} parameters, {spec.trainable_params:,} trainable, "
          f"{spec.param_bytes} B each; {spec.batch_size} trajectories per process, groups of {spec.num_generations}")
    print(plan.table())
    print(f"  {caps.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
