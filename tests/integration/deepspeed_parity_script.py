"""ThunderSync GRPO under DeepSpeed ZeRO on CPU processes, or the one-process reference on the same global batch.

Usage: `deepspeed_parity_script.py OUT MODEL CASE`; CASE `zero1` / `zero2` / ... runs under
`torchrun --nproc_per_node 2` (DeepSpeed's CPU accelerator, gloo), `one_<case>` is the same configuration in one
plain process (per_device_train_batch_size doubled: the same 8 rows per generation batch). Rank 0 writes the initial
and final trainable parameters, the pre-clip gradient norm of every optimizer step and the placement's name to
OUT/results.pt. Launched by test_deepspeed.py.

On CPU, accelerate 1.15 selects DeepSpeed only when `use_cpu=False` (accelerate/state.py: `... and not cpu`), and
then, without an accelerator device, `PartialState` finds no backend and sets `num_processes = 1` on every rank ("No
backend == no distributed training"): each rank would train alone. So the process group is configured here first,
with gloo (DeepSpeed's CPU accelerator, `DS_ACCELERATOR=cpu`, also picks gloo: oneccl_bindings_for_pytorch is
absent), and handed to the trainer with `accelerator_config={"use_configured_state": True}`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from benchmarks.parity import (
    cpu_config,
    load_model,
    prompt_dataset,
    reward_len,
    reward_parity,
    scripted_rollout_func,
)
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

# stage, then the config of both runs (per_device_train_batch_size is the 2-process value). Clipping is active
# (max_grad_norm below the gradient norms), the tiny model's rows have unequal token counts per rank and some
# unscorable rewards (reward_parity's None).
CASES = {
    "zero1": (1, dict(optim="adamw_torch", learning_rate=1e-2, max_grad_norm=0.5, per_device_train_batch_size=4)),
    "zero2": (2, dict(optim="sgd", learning_rate=0.05, max_grad_norm=0.5, per_device_train_batch_size=2,
                      gradient_accumulation_steps=2, beta=0.1)),
    # sampling from one embedded rollout server that rank 0 starts from the replica and publishes it to before every
    # step: the samples depend on the weights published (θ_k), so they are checked too
    "zero3": (3, dict(optim="sgd", learning_rate=0.05, max_grad_norm=0.5, per_device_train_batch_size=4,
                      rollout_engine="embedded_server", rollout_num_servers=1, rollout_max_in_flight=4)),
}


def deepspeed_config(stage: int) -> dict:
    """A ZeRO config whose sizes and clipping come from the TrainingArguments ("auto"), as in TRL's recipes."""
    return {"zero_optimization": {"stage": stage}, "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "bf16": {"enabled": False}, "fp16": {"enabled": False}}


def main(out: Path, model_path: str, case: str) -> None:
    one = case.startswith("one_")
    stage, overrides = CASES[case.removeprefix("one_")]
    overrides = dict(overrides)
    if one:
        overrides["per_device_train_batch_size"] *= 2
    else:
        from accelerate import PartialState

        from tests.fixtures.deepspeed_cpu import skip_shm_kernel_build

        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        skip_shm_kernel_build()
        PartialState(backend="gloo")  # the 2-process group on CPU (module docstring)
        overrides.update(use_cpu=False, deepspeed=deepspeed_config(stage),
                         accelerator_config={"use_configured_state": True})
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters() if p.requires_grad])
    args = cpu_config(ThunderSyncGRPOConfig, out / "run", num_generations=2, max_steps=3, **overrides)
    model = load_model(model_path)  # ZeRO-3: partitioned at load (zero.Init), the DeepSpeed config of `args` is live
    trainer = ThunderSyncGRPOTrainer(model=model, reward_funcs=[reward_len, reward_parity],
                                     args=args, train_dataset=prompt_dataset(16), processing_class=tokenizer,
                                     rollout_func=None if "rollout_engine" in overrides
                                     else scripted_rollout_func(tokenizer))
    try:
        trainer.train()
    except Exception as exc:  # the refusal text, for the test to check (every rank raises the same)
        if int(os.environ.get("RANK", "0")) == 0:
            (out / "error.txt").write_text(f"{type(exc).__name__}: {exc}")
        raise
    module = trainer.accelerator.unwrap_model(trainer.model)
    trainable = [p for p in module.parameters() if p.requires_grad]
    gathered = contextlib.nullcontext()
    if not one and stage == 3:  # the final parameters, whole (every rank gathers)
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(trainable)
    with gathered:
        params = torch.cat([p.detach().reshape(-1).clone() for p in trainable])
    norms = [row["grad_norm"] for row in trainer.state.log_history if "grad_norm" in row]
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save({"initial": initial, "params": params, "grad_norms": norms, "steps": trainer.state.global_step,
                    "placement": trainer._learner_placement().name}, out / "results.pt")


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
    except Exception:
        import traceback

        traceback.print_exc()
        code = 1
    else:
        code = 0
    if torch.distributed.is_initialized():
        if code == 0:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown (ddp_parity_script.py says why)
