"""Side-by-side runs of stock `trl.GRPOTrainer` and `ThunderSyncGRPOTrainer` on identical batches.

Both trainers get the same model weights, data order, scripted rollouts (through TRL's `rollout_func`, so the
completions are identical) and reward functions; `CaptureGrads` records the batch direction right before each
`optimizer.step()`. Used by the exactness tests and by `python -m trl_thundersync.bench.exactness`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback


def scripted_rollout_func(tokenizer, max_len: int = 8, vocab_low: int = 10, with_eos: float = 0.5,
                          member_order: str | None = None, calls: list | None = None):
    """A TRL `rollout_func` with deterministic pseudo-random completions, identical for every trainer.

    Content depends on (prompt text, occurrence within the batch, global step); some completions end in EOS, the
    others are truncated. `member_order` ("reverse" or "rotate") hands each prompt's completions out in another
    occurrence order: every GRPO group gets the same completions with its members permuted (the FP32 floor).
    `calls`, if given, receives (global step, prompts) of every call: which rows each generation batch saw.
    """

    def rollout_func(prompts, trainer):
        step = trainer.state.global_step
        texts = [prompt if isinstance(prompt, str) else prompt[-1]["content"] for prompt in prompts]
        if calls is not None:
            calls.append((step, list(texts)))
        seen: dict[str, int] = {}
        prompt_ids, completion_ids = [], []
        for text in texts:
            k = seen.get(text, 0)
            seen[text] = k + 1
            k = _permuted(k, texts.count(text), member_order)
            digest = hashlib.sha256(f"{text}|{k}|{step}".encode()).digest()
            length = 2 + digest[0] % (max_len - 1)
            ids = [vocab_low + digest[1 + j] % (len(tokenizer) - vocab_low - 1) for j in range(length)]
            if digest[-1] / 255 < with_eos:
                ids[-1] = tokenizer.eos_token_id
            prompt_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            completion_ids.append(ids)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": [[0.0] * len(c) for c in completion_ids]}

    return rollout_func


def _permuted(k: int, n: int, order: str | None) -> int:
    if order is None:
        return k
    if order == "reverse":
        return n - 1 - k
    if order == "rotate":
        return (k + 1) % n
    raise ValueError(f"member_order={order!r} is not None, 'reverse' or 'rotate'")


def reward_len(completion_ids, **kwargs) -> list[float]:
    return [float(len(c)) for c in completion_ids]


def reward_parity(completion_ids, **kwargs) -> list[float | None]:
    """Returns None (not applicable) on some rows, like a task-specific reward."""
    return [None if c[0] % 3 == 0 else float(sum(c) % 7) - 3.0 for c in completion_ids]


def reward_group_rank(prompts, completion_ids, **kwargs) -> list[float]:
    """Group-relative: rank of Σ ids among the call's completions of the same prompt (ties share the mean rank)."""
    keys = [sum(c) for c in completion_ids]
    ranks = []
    for prompt, key in zip(prompts, keys):
        peers = [k for p, k in zip(prompts, keys) if p == prompt]
        ranks.append(sum(k < key for k in peers) + 0.5 * (sum(k == key for k in peers) - 1))
    return [float(r) for r in ranks]


def reward_batch_relative_length(completions, **kwargs) -> list[float]:
    """Batch-relative: completion length relative to the mean of the call (the example of issue 10)."""
    mean = sum(len(c) for c in completions) / len(completions)
    return [(len(c) - mean) / 10 for c in completions]


def reward_constant(completion_ids, **kwargs) -> list[float]:
    """The same value on every row: zero spread in every group (σ = 0 under normalize_then_sum's per-function norm)."""
    return [1.0 for _ in completion_ids]


# Per-trajectory offset of the sampler's log-prob of every token (`offset_sampler_rollout_func`): the sequence's
# off-policy KL (TRL's `get_off_policy_mask`) is the offset, so a threshold of 0.5 splits the rows far from its edge.
SAMPLER_OFFSETS = (0.0, 1.0, 1.0, 0.0, 1.0, 0.2, 1.0, 0.8)


def offset_sampler_rollout_func(tokenizer, offsets=SAMPLER_OFFSETS, **scripted):
    """`scripted_rollout_func` whose `logprobs` are the policy's own log-probs at the current θ plus `offsets[i]`."""
    base = scripted_rollout_func(tokenizer, **scripted)

    def rollout_func(prompts, trainer):
        out = base(prompts, trainer)
        logprobs = []
        for i, (prompt, completion) in enumerate(zip(out["prompt_ids"], out["completion_ids"])):
            ids = torch.tensor([list(prompt) + list(completion)], device=trainer.model.device)
            with torch.no_grad():
                logits = trainer.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            own = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(completion, device=ids.device)[:, None])
            logprobs.append((own[:, 0] + offsets[i % len(offsets)]).tolist())
        out["logprobs"] = logprobs
        return out

    return rollout_func


def prompt_dataset(n: int = 8):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"Question {i}: what is {i} + {i}?" for i in range(n)]})


def cpu_config(cls, output_dir, **overrides):
    base = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", logging_steps=1,
        per_device_train_batch_size=4, num_generations=2, max_completion_length=8, max_steps=3,
        learning_rate=1e-2, save_strategy="no", seed=0, gradient_checkpointing=False, disable_tqdm=True,
    )
    base.update(overrides)
    return cls(**base)


def load_model(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


class CaptureGrads(TrainerCallback):
    """Records the flat trainable-parameter gradient right before every optimizer step (after clipping)."""

    def __init__(self) -> None:
        self.directions: list[torch.Tensor] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        grads = [p.grad.detach().reshape(-1).clone() for p in model.parameters() if p.requires_grad]
        self.directions.append(torch.cat(grads))


class StopAt(TrainerCallback):
    """Interrupts training after `step` optimizer steps (keeps max_steps, hence the learning-rate schedule)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


@dataclass(frozen=True)
class ParityRun:
    directions: list[torch.Tensor]  # batch direction of every optimizer step
    params: torch.Tensor  # trainable parameters after training, flat
    trainer: Any


def run_trainer(trainer_cls, config_cls, output_dir: Path, tokenizer, model_path, *, rewards=(reward_len,),
                peft_config=None, wrap_engine=None, callbacks=(), reward_processing_classes=None,
                member_order=None, rollout_func=None, rollout_calls: list | None = None, **overrides) -> ParityRun:
    capture = CaptureGrads()
    args = cpu_config(config_cls, output_dir, **overrides)
    if rollout_func is None:
        rollout_func = scripted_rollout_func(tokenizer, member_order=member_order, calls=rollout_calls)
    trainer = trainer_cls(
        model=load_model(model_path), reward_funcs=list(rewards), args=args, train_dataset=prompt_dataset(),
        processing_class=tokenizer, rollout_func=rollout_func,
        callbacks=[capture, *callbacks],
        peft_config=peft_config, reward_processing_classes=reward_processing_classes,
    )
    if wrap_engine is not None:
        trainer._engine = wrap_engine(trainer._rollout_engine())
    trainer.train()
    params = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters() if p.requires_grad])
    return ParityRun(capture.directions, params, trainer)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


# Every supported option, as GRPOConfig overrides (the exactness matrix of the tests and the bench).
PARITY_CASES: dict[str, dict] = {
    "dapo": dict(),
    "grpo": dict(loss_type="grpo"),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "bnpo": dict(loss_type="bnpo"),
    "cispo": dict(loss_type="cispo", epsilon_high=0.5),
    "sapo": dict(loss_type="sapo"),
    "vespo": dict(loss_type="vespo"),
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "scale_batch": dict(scale_rewards="batch"),
    "scale_none": dict(scale_rewards="none"),
    "beta_kl": dict(beta=0.1),
    "beta_kl_grpo_no_biascorr": dict(beta=0.05, loss_type="grpo", use_bias_correction_kl=False),
    "mask_truncated": dict(mask_truncated_completions=True),
    "sequence_level_is": dict(importance_sampling_level="sequence"),
    "ga2_dapo": dict(gradient_accumulation_steps=2, per_device_train_batch_size=2),
    "ga2_bnpo_beta": dict(gradient_accumulation_steps=2, per_device_train_batch_size=2, loss_type="bnpo", beta=0.1),
    "ga2_grpo_group4": dict(gradient_accumulation_steps=2, per_device_train_batch_size=4, num_generations=4,
                            loss_type="grpo"),
    "multi_reward_weights_none": dict(reward_weights=[0.5, 2.0]),
    "gradient_checkpointing": dict(gradient_checkpointing=True),
    "normalize_then_sum": dict(multi_objective_aggregation="normalize_then_sum", reward_weights=[0.5, 2.0]),
}

# MoE policies (`testing/tiny_moe.py`): TRL's router load-balancing term with the model's coefficient, a large one
# set in the field (so a wrong term shows), several micro-batches (the term is per micro-batch), KL, masking.
MOE_PARITY_CASES: dict[str, dict] = {
    "model_config_coef": dict(),  # router_aux_loss_coef=None: TRL reads the model config's 0.001
    "field_coef": dict(router_aux_loss_coef=0.5),
    "ga4_field_coef": dict(router_aux_loss_coef=0.5, gradient_accumulation_steps=4, per_device_train_batch_size=2),
    "ga2_bnpo_beta": dict(router_aux_loss_coef=0.5, gradient_accumulation_steps=2, per_device_train_batch_size=2,
                          loss_type="bnpo", beta=0.1),
    "ga2_mask_truncated_grpo": dict(router_aux_loss_coef=0.5, gradient_accumulation_steps=2,
                                    per_device_train_batch_size=2, mask_truncated_completions=True, loss_type="grpo"),
    "ga2_gradient_checkpointing": dict(router_aux_loss_coef=0.5, gradient_accumulation_steps=2,
                                       per_device_train_batch_size=2, gradient_checkpointing=True),
}

# TRL's entropy bonus (`entropy_coef`): a small and a large coefficient, several micro-batches (the bonus is a token
# mean per TRL micro-batch, whatever the loss type), with the KL term, the per-sequence / per-micro-batch / global
# policy normalizers, and masked truncations (zero-token rows count in no micro-batch's N_b).
ENTROPY_PARITY_CASES: dict[str, dict] = {
    "coef_0.01": dict(entropy_coef=0.01),
    "ga2_coef_0.5_dapo": dict(entropy_coef=0.5, gradient_accumulation_steps=2, per_device_train_batch_size=2),
    "ga2_coef_0.5_grpo_beta": dict(entropy_coef=0.5, gradient_accumulation_steps=2, per_device_train_batch_size=2,
                                   loss_type="grpo", beta=0.1),
    "ga2_coef_0.5_bnpo": dict(entropy_coef=0.5, gradient_accumulation_steps=2, per_device_train_batch_size=2,
                              loss_type="bnpo"),
    "ga4_coef_0.5_mask_truncated": dict(entropy_coef=0.5, gradient_accumulation_steps=4,
                                        per_device_train_batch_size=2, mask_truncated_completions=True),
    "ga2_coef_0.5_gradient_checkpointing": dict(entropy_coef=0.5, gradient_accumulation_steps=2,
                                                per_device_train_batch_size=2, gradient_checkpointing=True),
}


# num_iterations > 1 (`trainers/grpo_iterations.py`): pass 1 streamed, passes 2..μ TRL's loss on the buffered batch.
# Several loss types (clipped, cispo's truncated ratio, sapo's soft gate, bnpo per micro-batch), active PPO clipping,
# KL against the reference (its log-probs buffered with the batch), masked truncations, one and two micro-batches.
ITERATION_PARITY_CASES: dict[str, dict] = {
    "mu2_dapo": dict(num_iterations=2),
    "mu2_dapo_clipping": dict(num_iterations=2, epsilon=0.03),  # ε small enough that passes 2.. clip tokens
    "mu3_grpo": dict(num_iterations=3, loss_type="grpo"),
    "mu2_ga2_bnpo_beta": dict(num_iterations=2, gradient_accumulation_steps=2, per_device_train_batch_size=2,
                              loss_type="bnpo", beta=0.1),
    "mu3_ga2_cispo_mask_truncated": dict(num_iterations=3, gradient_accumulation_steps=2,
                                         per_device_train_batch_size=2, loss_type="cispo", epsilon_high=0.5,
                                         mask_truncated_completions=True),
    "mu2_sapo_sequence_is": dict(num_iterations=2, loss_type="sapo", importance_sampling_level="sequence"),
    # the streamed pass and TRL's passes share one adaptive entropy controller (its coefficient moves every step)
    "mu2_adaptive_entropy": dict(num_iterations=2, use_adaptive_entropy=True, entropy_coef=0.1,
                                 entropy_coef_delta=0.05, entropy_target=100.0),
    "mu2_normalize_then_sum": dict(num_iterations=2, multi_objective_aggregation="normalize_then_sum"),
}
