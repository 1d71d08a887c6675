"""ThunderSyncGKDTrainer (OPD, served teacher) under DeepSpeed ZeRO / FSDP2 on 2 CPU processes, or one plain process.

Usage: `gkd_engine_script.py OUT MODEL CASE [VARIANT]` with the teacher served at $TS_TEST_TEACHER_URL (read-only,
started by test_gkd_engines.py) and its weights at $TS_TEST_TEACHER_PATH (the local-teacher VARIANTs below). CASE
`one`: one plain process on the global batch of 4 rows; `ddp` / `zero1` / `zero2` / `zero3` / `fsdp2`: under
`torchrun --nproc_per_node 2`, each process streaming its 2 rows (seeded by their global row), with the CPU shims of
deepspeed_parity_script.py (a gloo PartialState) and engine_parity_script.py (enable_fsdp_on_cpu).
Rank 0 writes OUT/results.pt: the initial and final trainable parameters (whole), the pre-clip gradient norm of
every optimizer step, the logged losses and scored-token counts, and the placement's name.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from benchmarks.parity import load_model
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer


def messages(n=12):
    return Dataset.from_dict({"messages": [[{"role": "user", "content": f"What is {i} + {i}?"},
                                            {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]
                                           for i in range(n)]})


def deepspeed_config(stage: int) -> dict:
    return {"zero_optimization": {"stage": stage}, "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "bf16": {"enabled": False}, "fp16": {"enabled": False}}


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().reshape(-1).clone()


LOGGED = ("loss", "grad_norm", "thundersync/scored_tokens", "thundersync/normalizer_tokens", "thundersync/on_policy")
VARIANTS = {  # what the trainer distills with, on top of the fields below
    # OPD against the served teacher, on-policy only
    "served_opd": dict(objective="opd", lmbda=1.0),
    # generalized JSD against a local teacher_model (TRL prepares it through the engine), lmbda=0.5: seed 3 draws
    # on, off, on — a streamed step, TRL's own step through the engine, then a streamed step on the re-gathered
    # replica (a stale one would show in the third step)
    # (DistillationTrainer's normalization, the one-process step on any number of processes; stock GKD's gives
    # 1/num_processes of it, as stock TRL does: `local_seqkd` keeps that default, against DDP)
    "local_gjsd_mixed": dict(objective="gjsd", lmbda=0.5, seed=3, on_policy_normalizer="scored_tokens"),
    # the same with seq_kd: the off-policy steps train on the teacher's own samples (sampled per process, so the
    # yardstick is DDP on as many processes, whose ranks draw from the same RNG states)
    "local_seqkd": dict(objective="gjsd", lmbda=0.5, seq_kd=True, seed=3),
}


def main(out: Path, model_path: str, case: str, variant: str) -> None:
    world = 1 if case == "one" else 2
    engine: dict = {}
    if case.startswith("zero"):
        from accelerate import PartialState

        from tests.fixtures.deepspeed_cpu import skip_shm_kernel_build

        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        skip_shm_kernel_build()
        PartialState(backend="gloo")
        engine = dict(use_cpu=False, deepspeed=deepspeed_config(int(case[-1])),
                      accelerator_config={"use_configured_state": True})
    elif case == "fsdp2":
        engine = dict(fsdp=True, fsdp_config={"version": 2})
    # clipping active (max_grad_norm below every step's norm), SGD, sampled by the local engine from the placement's
    # module (ZeRO-3 / FSDP2: the replica gathered at the batch start), the VARIANT's objective and teacher
    fields = dict(output_dir=str(out / "run"), use_cpu=True, bf16=False, report_to="none",
                  per_device_train_batch_size=4 // world, max_steps=3, max_new_tokens=10, logging_steps=1,
                  save_strategy="no", disable_tqdm=True, seed=0, learning_rate=0.05, optim="sgd", max_grad_norm=0.05,
                  rollout_engine="local_thread", gradient_checkpointing=False)
    fields.update(VARIANTS[variant])
    served = variant == "served_opd"
    if served:
        fields["teacher_server_url"] = os.environ["TS_TEST_TEACHER_URL"]
    # θ_0 read before the config exists: under ZeRO-3 the config registers itself and every later load is partitioned
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters() if p.requires_grad])
    args = ThunderSyncGKDConfig(**{**fields, **engine})
    if case == "fsdp2":
        from tests.integration.engine_parity_script import enable_fsdp_on_cpu

        enable_fsdp_on_cpu()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    teacher = None if served else load_model(os.environ["TS_TEST_TEACHER_PATH"])  # ZeRO-3: partitioned at load
    trainer = ThunderSyncGKDTrainer(model=load_model(model_path), teacher_model=teacher, args=args,
                                    train_dataset=messages(), processing_class=tokenizer)  # (args is live)
    trainer.train()
    module = trainer.accelerator.unwrap_model(trainer.model)
    trainable = [p for p in module.parameters() if p.requires_grad]
    gathered = contextlib.nullcontext()
    if case == "zero3":
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(trainable)
    with gathered:
        params = torch.cat([full(p) for p in trainable])
    logs = [{k: row[k] for k in LOGGED if k in row} for row in trainer.state.log_history if "loss" in row]
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save({"initial": initial, "params": params, "logs": logs, "steps": trainer.state.global_step,
                    "policy_version": trainer.policy_version, "placement": trainer._learner_placement().name},
                   out / "results.pt")


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "served_opd")
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
