"""The checks of `scripts/gpu_check.py` (one function per check; each returns its numbers and a pass flag).

Each check builds what it needs (tiny model folders, a larger random Qwen3 for throughput), runs the trainers on
`device` and returns a plain dict: `passed` (bool), `numbers` (what was measured) and `detail` (one line). A check
raises `SkippedCheck` for what the machine cannot run (a missing package, no CUDA), so the report names the reason.
"""

from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import torch

FP32_TOLERANCE = 1e-5  # the project's exactness / DDP bound
BF16_FLOOR_FACTOR = 2.0  # bf16: within 2x the permuted-order floor of stock TRL


class SkippedCheck(Exception):
    """The check cannot run on this machine; the message says why (reported, never silent)."""


def require(module: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install raising something else at import
        raise SkippedCheck(f"`import {module}` failed: {type(exc).__name__}: {exc}") from exc


def tiny_paths(work: Path) -> tuple[str, str]:
    """The tiny policy (trl_thundersync.tiny.model defaults) and a larger tiny teacher (as the GKD tests use)."""
    from trl_thundersync.tiny.model import save_tiny_model

    policy = save_tiny_model(work / "tiny-qwen3")
    teacher = save_tiny_model(work / "tiny-teacher", hidden_size=96, num_layers=3, seed=7)
    return str(policy), str(teacher)


def _on_device(device: str, bf16: bool) -> dict:
    return dict(use_cpu=device == "cpu", bf16=bf16)


def grpo_exactness(work: Path, device: str, cases: list[str]) -> dict:
    """Check 1: ThunderSync vs stock TRL on identical batches, FP32 and bf16 autocast, next to TRL's own floor."""
    for module in ("trl", "peft"):
        require(module)
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.parity import PARITY_CASES, relative_error, reward_len, reward_parity, run_trainer
    from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

    model_path, _ = tiny_paths(work)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows, passed = {}, True
    for case in cases:
        overrides = dict(PARITY_CASES[case], max_steps=1, max_grad_norm=0.0)
        rewards = (reward_len, reward_parity) if "reward_weights" in overrides else (reward_len,)

        def direction(cls, config, name, bf16, **extra):
            run = run_trainer(cls, config, work / "grpo" / case / name, tokenizer, model_path,  # noqa: B023
                              rewards=rewards, **overrides, **_on_device(device, bf16), **extra)  # noqa: B023
            return run.directions[0].float().cpu()

        exact = {"trl": direction(GRPOTrainer, GRPOConfig, "trl32", False),
                 "permuted": direction(GRPOTrainer, GRPOConfig, "trl32_perm", False, member_order="reverse"),
                 "ts": direction(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, "ts32", False)}
        half = {"trl": direction(GRPOTrainer, GRPOConfig, "trl16", True),
                "permuted": direction(GRPOTrainer, GRPOConfig, "trl16_perm", True, member_order="reverse"),
                "ts": direction(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, "ts16", True)}
        row = _precision_rows(exact, half, relative_error)
        rows[case] = row
        passed &= row["fp32_ok"] and row["bf16_ok"]
    return {"passed": passed, "numbers": rows,
            "detail": "FP32 <= 1e-5 of TRL; bf16: ThunderSync's distance to TRL's FP32 direction <= 2x stock TRL's "
                      "own bf16 distance (the precision floor); permuted-order floors reported"}


def _precision_rows(exact: dict, half: dict, relative_error) -> dict:
    """FP32: ThunderSync vs TRL next to TRL vs TRL with the batch permuted. bf16: the permuted floor of a padded
    bf16 batch is near FP32's (row order barely changes a batched kernel), while ThunderSync's unpadded
    per-source passes round differently; the fair bound is the distance to the exact (FP32) direction, which stock
    TRL in bf16 sets: ThunderSync in bf16 must be no farther than 2x that."""
    ref = exact["trl"]
    row = {"fp32_rel_error": relative_error(exact["ts"], ref), "fp32_floor": relative_error(exact["permuted"], ref),
           "bf16_rel_error_vs_trl_bf16": relative_error(half["ts"], half["trl"]),
           "bf16_permuted_floor": relative_error(half["permuted"], half["trl"]),
           "bf16_ts_vs_fp32": relative_error(half["ts"], ref),
           "bf16_trl_vs_fp32": relative_error(half["trl"], ref)}
    row["fp32_ok"] = row["fp32_rel_error"] <= FP32_TOLERANCE
    row["bf16_ok"] = row["bf16_ts_vs_fp32"] <= BF16_FLOOR_FACTOR * max(row["bf16_trl_vs_fp32"], FP32_TOLERANCE)
    return row


def _gkd_samples_and_direction(work: Path, device: str, bf16: bool, model_path: str, teacher_path: str):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from benchmarks.parity import CaptureGrads, load_model
    from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    data = Dataset.from_dict({"messages": [[{"role": "user", "content": f"What is {i} + {i}?"},
                                            {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]
                                           for i in range(8)]})
    args = ThunderSyncGKDConfig(output_dir=str(work / "gkd" / str(bf16)), gradient_checkpointing=False,
                                report_to="none", per_device_train_batch_size=4, max_steps=1, max_new_tokens=10,
                                lmbda=1.0, logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
                                learning_rate=1e-2, optim="sgd", max_grad_norm=1e9, rollout_engine="local_thread",
                                beta=0.3, objective="gjsd", on_policy_normalizer="scored_tokens",
                                **_on_device(device, bf16))  # the reference below: TRL's loss over the scored tokens
    capture = CaptureGrads()
    trainer = ThunderSyncGKDTrainer(model=load_model(model_path), teacher_model=load_model(teacher_path), args=args,
                                    train_dataset=data, processing_class=tokenizer, callbacks=[capture])
    samples: list = []
    record = trainer._record_step  # as tests/integration/test_gkd_trainer.py: the rollouts the step scored
    trainer._record_step = lambda *a: (samples.extend(i.rollout for i in trainer._open_step[3]
                                                      if hasattr(i, "rollout")), record(*a))
    trainer.train()
    return tokenizer, sorted(samples, key=lambda r: r.index), capture.directions[0].float().cpu()


def _gkd_reference(tokenizer, samples, model_path, teacher_path, device, bf16, reverse=False):
    """TRL's generalized JSD gradient on a right-padded batch of the same tokens (rows reversed: the floor)."""
    from trl.experimental.gkd import GKDTrainer

    from benchmarks.parity import load_model

    samples = list(reversed(samples)) if reverse else samples
    student, teacher = load_model(model_path).to(device), load_model(teacher_path).to(device)
    rows = [list(r.prompt_ids) + list(r.completion_ids) for r in samples]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attention, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for i, (row, r) in enumerate(zip(rows, samples, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        labels[i, len(r.prompt_ids) : len(row)] = torch.tensor(r.completion_ids)
    ids, attention, labels = ids.to(device), attention.to(device), labels.to(device)
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
        with torch.no_grad():
            teacher_logits = teacher(input_ids=ids, attention_mask=attention).logits
        logits = student(input_ids=ids, attention_mask=attention).logits
        loss = GKDTrainer.generalized_jsd_loss(logits[:, :-1], teacher_logits[:, :-1], labels[:, 1:], beta=0.3)
    grads = torch.autograd.grad(loss, list(student.parameters()))
    return torch.cat([g.reshape(-1) for g in grads]).float().cpu()


def gkd_exactness(work: Path, device: str) -> dict:
    """Check 2: ThunderSyncGKDTrainer (local teacher, generalized JSD) vs TRL's loss on the same sampled tokens."""
    require("trl")
    from benchmarks.parity import relative_error

    model_path, teacher_path = tiny_paths(work)
    exact, half = {}, {}
    for values, bf16 in ((exact, False), (half, True)):
        tokenizer, samples, values["ts"] = _gkd_samples_and_direction(work, device, bf16, model_path, teacher_path)
        values["trl"] = _gkd_reference(tokenizer, samples, model_path, teacher_path, device, bf16)
        values["permuted"] = _gkd_reference(tokenizer, samples, model_path, teacher_path, device, bf16, reverse=True)
    rows = _precision_rows(exact, half, relative_error)
    passed = rows["fp32_ok"] and rows["bf16_ok"]
    return {"passed": passed, "numbers": rows,
            "detail": "gjsd beta=0.3 vs trl GKDTrainer.generalized_jsd_loss; floor: the batch rows reversed"}


def policy_publication(work: Path, device: str) -> dict:
    """Check 5: `policy_tensors` of a bf16 LoRA policy on `device`, as the NCCL publisher announces and streams it."""
    require("peft")
    from peft import LoraConfig, get_peft_model

    from benchmarks.parity import load_model
    from trl_thundersync.rollout.vllm_publish import TRLNCCLPublisher
    from trl_thundersync.rollout.weights import policy_state_dict, policy_tensors

    model_path, _ = tiny_paths(work)
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                      init_lora_weights=False)  # B != 0: the merged weights differ from the base ones
    model = get_peft_model(load_model(model_path, dtype=torch.bfloat16).to(device), lora)
    publisher = TRLNCCLPublisher(device=device, client_factory=lambda **_: None)
    publisher.prepare(model, 1)
    reference = policy_state_dict(model)  # merged in FP32 on the CPU
    streamed = list(policy_tensors(model))
    problems, worst, merged_worst = [], 0.0, 0.0
    if [n for n, _ in streamed] != [n for n, _, _ in publisher._metadata]:
        problems.append("stream order/names differ from the publisher's metadata")
    for (name, tensor), (_, dtype, shape) in zip(streamed, publisher._metadata, strict=False):
        if str(tensor.dtype).removeprefix("torch.") != dtype or list(tensor.shape) != shape:
            problems.append(f"{name}: {tensor.dtype} {tuple(tensor.shape)} vs metadata {dtype} {shape}")
        if tensor.device.type != torch.device(device).type:
            problems.append(f"{name}: on {tensor.device}, the model is on {device}")
        ref = reference[name]
        rel = float((tensor.float().cpu() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))
        worst = max(worst, rel)
        if ".q_proj." in name or ".v_proj." in name:
            merged_worst = max(merged_worst, rel)
    tol = 2.0**-8  # one bf16 rounding of the FP32 merge, relative to the tensor's scale
    if worst > tol:
        problems.append(f"max relative deviation {worst:.2e} > bf16 rounding {tol:.2e}")
    return {"passed": not problems, "numbers": {"tensors": len(streamed), "max_rel_dev": worst,
                                                 "max_rel_dev_lora_merged": merged_worst, "bf16_tol": tol},
            "detail": "; ".join(problems[:3]) or "names/dtypes/shapes/devices as announced, values = FP32 merge"}


def _throughput_model(work: Path, quick: bool) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trl_thundersync.tiny.model import save_model_folder

    if quick:
        return tiny_paths(work)[0]

    def build(tokenizer):
        torch.manual_seed(0)
        config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=1024, intermediate_size=3072,
                             num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=8, head_dim=64,
                             max_position_embeddings=4096, tie_word_embeddings=True,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        return Qwen3ForCausalLM(config)

    return str(save_model_folder(work / "qwen3-1024x12", build))


class _StepTimer:
    """Wall seconds of every optimizer step (generation, rewards and backward included: both trainers alike)."""

    def __init__(self, device: str) -> None:
        from transformers import TrainerCallback

        timer = self

        class Callback(TrainerCallback):
            def on_step_begin(self, *a, **k):
                timer._sync()
                timer.start = time.perf_counter()

            def on_step_end(self, *a, **k):
                timer._sync()
                timer.seconds.append(time.perf_counter() - timer.start)

        self.device, self.seconds, self.start, self.callback = device, [], 0.0, Callback()

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


def backward_throughput(work: Path, device: str, quick: bool) -> dict:
    """Check 3: tokens/s and peak memory of ThunderSync's streamed step vs stock TRL's step, same batches, bf16."""
    require("trl")
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.parity import run_trainer, scripted_rollout_func
    from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

    model_path = _throughput_model(work, quick)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    max_len = 8 if quick else 512
    steps = 2 if quick else 4
    numbers = {}
    for name, cls, config in (("trl", GRPOTrainer, GRPOConfig), ("ts", ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig)):
        tokens: list[int] = []
        scripted = scripted_rollout_func(tokenizer, max_len=max_len)

        def rollout(prompts, trainer, scripted=scripted, tokens=tokens):
            out = scripted(prompts, trainer)
            tokens.append(sum(len(p) + len(c) for p, c in zip(out["prompt_ids"], out["completion_ids"], strict=True)))
            return out

        timer = _StepTimer(device)
        if device == "cuda":
            gc.collect()  # the previous trainer's model and optimizer state
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        run = run_trainer(cls, config, work / "throughput" / name, tokenizer, model_path, rollout_func=rollout,
                          callbacks=(timer.callback,), max_steps=steps, max_completion_length=max_len,
                          per_device_train_batch_size=8, num_generations=4, optim="sgd", learning_rate=1e-5,
                          **_on_device(device, True))
        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
        timed = timer.seconds[1:] or timer.seconds  # the first step warms up kernels and allocator
        step = statistics.median(timed)
        row = {"step_seconds": step, "tokens_per_step": statistics.mean(tokens[1:] or tokens),
               "peak_cuda_mb": peak}
        row["tokens_per_s"] = row["tokens_per_step"] / step
        if name == "ts":
            logs = [h for h in run.trainer.state.log_history if "thundersync/learner_busy_seconds" in h]
            busy = statistics.median([h["thundersync/learner_busy_seconds"] for h in logs[1:] or logs])
            row.update(learner_busy_seconds=busy, backward_tokens_per_s=row["tokens_per_step"] / busy,
                       stats_bound_mb=max(h.get("thundersync/stats_bound_mb", 0.0) for h in logs))
        numbers[name] = row
        del run
    passed = all(r["tokens_per_s"] > 0 for r in numbers.values())
    return {"passed": passed, "numbers": numbers,
            "detail": "measurement (passes when both trainers ran); model " + Path(model_path).name}
