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

from .activations import ModelShape, plan_passes
from .budget import choose_caps, parse_budget
from .plan import MemorySpec, plan_memory

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# trainer-config fields the plan reads, with ThunderSyncGRPOConfig's defaults where TRL's differ from none
FIELDS = {"per_device_train_batch_size": (int, 8), "gradient_accumulation_steps": (int, 1),
          "steps_per_generation": (int, None), "num_generations": (int, 8), "release": (str, "content"),
          "max_open_groups": (int, None), "max_buffered_trajectories": (int, None), "memory_budget": (str, "auto"),
          "beta": (float, 0.0), "optim": (str, "adamw_torch"), "schedule": (str, "thundersync"),
          "max_completion_length": (int, 256), "batch_group_max_tokens": (int, 2048),
          "gradient_checkpointing": (int, 0), "shared_prefix": (int, 1), "shared_prefix_min_prompt_tokens": (int, 256)}
PROMPT_TOKENS = 256  # the prompt length the passes are planned for, unless --prompt_length says otherwise


def load_config(model_config: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_config.parent if model_config.is_file() else model_config))


def parameter_counts(model_config: Path, lora_r: int | None) -> tuple[int, int, int]:
    """(all parameters, trainable parameters, the largest trainable one) of the model `model_config` describes,
    built on the meta device; with `lora_r`, the trainable ones are a rank-r adapter on every linear layer but the
    output head (PEFT's "all-linear")."""
    from transformers import AutoModelForCausalLM

    config = load_config(model_config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    if lora_r is None:
        return total, total, max(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    adapter = sum(lora_r * (m.in_features + m.out_features) for m in linears)
    return total + adapter, adapter, max(lora_r * max(m.in_features, m.out_features) for m in linears)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trl_thundersync.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="a model folder with config.json, or the file")
    parser.add_argument("--config", type=Path, help="a YAML trainer config to read the fields below from")
    parser.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default=None,
                        help="the parameters' dtype (default: the model config's, else float32)")
    parser.add_argument("--lora_r", type=int, default=None, help="plan a LoRA adapter of this rank (all-linear)")
    parser.add_argument("--sharded", action="store_true", help="ZeRO-3 / FSDP2 full shard (a replica per rank)")
    parser.add_argument("--ranks", type=int, default=1,
                        help="learner ranks sharing the optimizer state (ZeRO-1); parameters replicated")
    parser.add_argument("--optimizer_state_bytes", type=int, choices=(2, 4), default=None,
                        help="bytes per optimizer state element (default: the parameters'; 4: FP32 moments)")
    parser.add_argument("--host_state", action="store_true",
                        help="plan the paper's layout: the FP32 streamed state in pinned host memory (a design: the "
                             "trainer keeps it on the device today)")
    parser.add_argument("--prompt_length", type=int, default=PROMPT_TOKENS,
                        help=f"prompt tokens the passes' activations are planned for (default {PROMPT_TOKENS})")
    for name, (kind, _) in FIELDS.items():
        parser.add_argument(f"--{name}", type=kind, default=None)
    return parser.parse_args(argv)


def spec_from_args(args: argparse.Namespace) -> MemorySpec:
    given = yaml.safe_load(args.config.read_text()) or {} if args.config else {}
    value = {name: getattr(args, name) if getattr(args, name) is not None else given.get(name, default)
             for name, (_, default) in FIELDS.items()}
    steps = value["steps_per_generation"] or value["gradient_accumulation_steps"]
    total, trainable, largest = parameter_counts(args.model, args.lora_r)
    dtype = args.dtype or _config_dtype(args.model)
    passes = plan_passes(ModelShape.from_config(load_config(args.model)), prompt_tokens=args.prompt_length,
                         completion_tokens=value["max_completion_length"], num_generations=value["num_generations"],
                         group_passes=True, max_pass_tokens=value["batch_group_max_tokens"],
                         trl_rows=value["per_device_train_batch_size"], dtype_bytes=DTYPE_BYTES[dtype],
                         checkpointed=bool(value["gradient_checkpointing"]),
                         shared_prefix_from=value["shared_prefix_min_prompt_tokens"] if value["shared_prefix"]
                         else None)
    return MemorySpec(
        total_params=total, trainable_params=trainable, param_bytes=DTYPE_BYTES[dtype], optimizer=value["optim"],
        batch_size=value["per_device_train_batch_size"] * steps, num_generations=value["num_generations"],
        release=value["release"], max_open_groups=value["max_open_groups"],
        max_buffered_trajectories=value["max_buffered_trajectories"], beta=value["beta"],
        peft=args.lora_r is not None, sharded=args.sharded, micro_batches=steps,
        activation_bytes=passes.streamed_bytes, trl_activation_bytes=passes.trl_bytes, pass_tokens=passes.tokens,
        prefix_bytes=passes.prefix_bytes,
        optimizer_shards=args.ranks, optimizer_state_bytes=args.optimizer_state_bytes, host_state=args.host_state,
        largest_param=largest)


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
    if args.host_state:
        print("  host_state: a design from the paper (section 4.3, appendix H.2); the trainer keeps the streamed "
              "state on the learner's device today")
    print(f"  activations: group passes of up to batch_group_max_tokens, prompts of {args.prompt_length} tokens "
          "(--prompt_length) and max_completion_length; the framework line is measured by the trainer only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
