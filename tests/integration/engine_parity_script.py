"""Run under `torchrun --nproc_per_node N`: ThunderSync under a sharding engine vs one plain process, same global batch.

argv: output folder, model path, case. Cases (each runs several trainers in one launch, to keep CI time small):
- `reference`: one process, no engine: the runs below on the whole global batch of 8 rows;
- `fsdp2`: every process under FSDP2 (full shard) on its share of the 8 rows.
Runs: `full` (full weights, TRL's `rollout_func` with scripted completions of unequal lengths, clipping active,
beta=0.1 against a separate reference model, gradient_accumulation_steps=2),
`lora` (LoRA adapters, beta=0.1 against the adapter-disabled policy, one embedded rollout server started by rank 0
from the placement's replica, the adapter published once per version). Rank 0 writes `results.pt`: per run, the
batch direction before every optimizer step and the initial and final trainable parameters, in full. `fsdp2` also
checks, in the same launch, that `num_iterations > 1` is refused by name.

accelerate 1.15 turns FSDP on only for GPU-class process groups (`AcceleratorState`: MULTI_GPU, MULTI_NPU, ...; a
MULTI_CPU run ignores the FSDP plugin and runs as DDP). `enable_fsdp_on_cpu` marks the CPU process group as
multi-device before the trainer builds its Accelerator, so accelerate applies its own FSDP2 preparation
(`fsdp2_prepare_model`: `fully_shard` per decoder layer, DTensor parameters over a gloo mesh) here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, TrainerCallback

from benchmarks.parity import (
    cpu_config,
    load_model,
    prompt_dataset,
    reward_len,
    reward_parity,
    scripted_rollout_func,
)
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

FSDP2 = dict(fsdp=True, fsdp_config={"version": 2})


def enable_fsdp_on_cpu() -> None:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    state = PartialState()
    if state.distributed_type == DistributedType.MULTI_CPU:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().reshape(-1).clone()


class CaptureFullGrads(TrainerCallback):
    """The whole batch direction right before every optimizer step (after clipping), gathered from the shards."""

    def __init__(self) -> None:
        self.directions: list[torch.Tensor] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.directions.append(torch.cat([full(p.grad) for p in model.parameters() if p.requires_grad]))


def run(name: str, out: Path, model_path: str, tokenizer, world: int, engine: dict) -> dict:
    from peft import LoraConfig

    lora = name == "lora"
    torch.manual_seed(0)  # the LoRA initialization: the same in every run
    capture = CaptureFullGrads()
    common = dict(per_device_train_batch_size=8 // world, num_generations=2, max_steps=3, optim="sgd", **engine)
    if lora:
        args = cpu_config(ThunderSyncGRPOConfig, out / name, learning_rate=0.5, max_grad_norm=1e6, beta=0.1,
                          rollout_engine="embedded_server", rollout_num_servers=1, vllm_weight_publisher="lora",
                          rollout_max_in_flight=4, **common)
        extra = dict(peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            lora_dropout=0.0), train_dataset=prompt_dataset(16))
    else:  # clipping active: accelerate's clip_grad_norm_ on the DTensor gradients must see the global norm;
        # beta: a separate reference model, which TRL shards too (the placement's reference replica); two micro-steps
        # per optimizer step (the direction is handed over at the first, the step taken at the second)
        args = cpu_config(ThunderSyncGRPOConfig, out / name, learning_rate=0.05, max_grad_norm=0.5, beta=0.1,
                          **dict(common, per_device_train_batch_size=4 // world, gradient_accumulation_steps=2))
        extra = dict(rollout_func=scripted_rollout_func(tokenizer), train_dataset=prompt_dataset())
    if engine:
        enable_fsdp_on_cpu()  # after the config: its device setup builds the process state
    trainer = ThunderSyncGRPOTrainer(model=load_model(model_path), reward_funcs=[reward_len, reward_parity],
                                     args=args, processing_class=tokenizer, callbacks=[capture], **extra)
    initial = torch.cat([full(p) for p in trainer.model.parameters() if p.requires_grad])
    trainer.train()
    params = torch.cat([full(p) for p in trainer.model.parameters() if p.requires_grad])
    placement = trainer._placement
    return {"directions": capture.directions, "initial": initial, "params": params, "placement": placement.name,
            "memory": placement.memory() if hasattr(placement, "memory") else None}


def refused_num_iterations(out: Path, model_path: str, tokenizer, world: int) -> str:
    from trl_thundersync.errors import UnsupportedOptionError

    args = cpu_config(ThunderSyncGRPOConfig, out / "mu2", per_device_train_batch_size=8 // world, max_steps=1,
                      num_iterations=2, **FSDP2)
    enable_fsdp_on_cpu()
    try:  # refused at construction, before any batch
        ThunderSyncGRPOTrainer(model=load_model(model_path), reward_funcs=[reward_len], args=args,
                               processing_class=tokenizer, train_dataset=prompt_dataset(),
                               rollout_func=scripted_rollout_func(tokenizer))
    except UnsupportedOptionError as exc:
        return str(exc)
    return "not refused"


def main() -> None:
    out, model_path, case = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    world = int(os.environ["WORLD_SIZE"])
    engine = FSDP2 if case == "fsdp2" else {}
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    results = {name: run(name, out, model_path, tokenizer, world, engine) for name in ("full", "lora")}
    if case == "fsdp2":
        results["num_iterations_refusal"] = refused_num_iterations(out, model_path, tokenizer, world)
    if int(os.environ["RANK"]) == 0:
        torch.save(results, out / "results.pt")
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as ddp_parity_script.py: results saved, every rank past the barrier; no interpreter teardown


if __name__ == "__main__":
    main()
