"""`num_iterations > 1`: the first pass over a generation batch streams, passes 2..μ run as `trl.GRPOTrainer` runs them.

TRL 1.16 reuses each generation batch for μ = `num_iterations` optimizer steps (its `RepeatSampler` repeats the batch's
rows μ·`steps_per_generation` times; `_prepare_inputs` generates when `_step % (steps_per_generation·μ) == 0` and
otherwise returns `_buffered_inputs[_step % steps_per_generation]`, the same shuffled micro-batches for every pass).
Pass 1 runs at θ_k, where TRL's ratio exp(logp − old) is 1 and clipping is inactive: that is the direction ThunderSync
streams during the rollouts. Passes 2..μ run at θ_{k+1}, …, θ_{k+μ-1} with PPO clipping against θ_k's log-probs, so
they need the updated parameters and cannot be streamed. Here they run TRL's own code: the streamed pass leaves
TRL-format micro-batches in `_buffered_inputs` (built from the batch's scored trajectories exactly as
`_generate_and_score_completions` builds them, with `old_per_token_logps` and `ref_per_token_logps` computed at θ_k
as TRL computes them), and each later micro-step is `GRPOTrainer.training_step` (TRL's `_prepare_inputs`,
`compute_loss`, backward; TRL's loop clips and steps). θ is published to the rollout engine once per generation
batch, after its last pass (`publishes_after`).
"""

from __future__ import annotations

from typing import Any

import torch
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import pad, split_tensor_dict

from ..errors import ConfigurationError
from ..streaming.importance import SamplingCorrection


def replays(trainer: Any) -> bool:
    """Whether this micro-step is a pass 2..μ over the buffered generation batch (TRL's own training_step)."""
    spg = trainer.args.steps_per_generation
    return (trainer.args.num_iterations > 1 and (trainer._step // spg) % trainer.args.num_iterations != 0
            and trainer._buffered_inputs is not None)


def replay_step(trainer: Any, model, inputs, num_items_in_batch):
    """One micro-step of passes 2..μ: `trl.GRPOTrainer.training_step` itself (its `_prepare_inputs` returns the
    buffered micro-batch). TRL was built with use_vllm=False (ThunderSync's engine talks to the servers), so TRL's loss
    sees the real setting while it runs: with use_vllm=True it applies the buffered vLLM importance-sampling ratio."""
    from trl import GRPOTrainer

    built_with = trainer.use_vllm
    trainer.use_vllm = trainer.args.use_vllm
    try:
        return GRPOTrainer.training_step(trainer, model, inputs, num_items_in_batch)
    finally:
        trainer.use_vllm = built_with


def publishes_after(global_step: int, num_iterations: int) -> bool:
    """θ goes to the rollout engine once per generation batch: after the step of its last pass (TRL syncs its vLLM
    weights only when it generates, i.e. every num_iterations optimizer steps)."""
    return global_step % num_iterations == 0


def buffer_generation_batch(trainer: Any, scored, advantages: list[float], permutation: list[int]) -> None:
    """TRL's `_buffered_inputs` for passes 2..μ: the batch as `_generate_and_score_completions` returns it, shuffled
    with the permutation the streamed pass used (TRL's `shuffle_sequence_dict`) and split into micro-batches."""
    batch = generation_batch(trainer, sorted(scored, key=lambda s: s.rollout.index), advantages)
    index = torch.tensor(permutation)
    shuffled = {k: (v if v.ndim == 0 else v[index.to(v.device)]) for k, v in batch.items()}
    trainer._buffered_inputs = split_tensor_dict(shuffled, trainer.args.steps_per_generation)


def generation_batch(trainer: Any, scored, advantages: list[float]) -> dict[str, torch.Tensor]:
    """What TRL's `_generate_and_score_completions` returns for these trajectories (text-only, no tools, one
    process): padded ids and masks, advantages, `num_items_in_batch`, θ_k's / the reference's per-token log-probs
    computed over the padded batch in micro-batches of per_device_train_batch_size, as TRL computes them, and the
    sampler's log-probs with TRL's vLLM importance-sampling ratio when that correction is on."""
    device = trainer.accelerator.device
    pad_id = trainer._tokenizer.pad_token_id
    multiple = trainer.pad_to_multiple_of
    prompts = [torch.tensor(s.rollout.prompt_ids, dtype=torch.long) for s in scored]
    completions_list = [list(s.rollout.completion_ids) for s in scored]
    completions = [torch.tensor(ids, dtype=torch.long) for ids in completions_list]
    prompt_ids = pad(prompts, padding_value=pad_id, padding_side="left", pad_to_multiple_of=multiple).to(device)
    prompt_mask = pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left",
                      pad_to_multiple_of=multiple).to(device)
    completion_ids = pad(completions, padding_value=pad_id, padding_side="right", pad_to_multiple_of=multiple).to(device)
    completion_mask = pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right",
                          pad_to_multiple_of=multiple).to(device)
    tool_mask = None
    if trainer._agentic() or any(s.rollout.env_mask is not None for s in scored):  # TRL's tool_mask: 0 on tool tokens
        tool_mask = pad([torch.tensor(s.rollout.env_mask if s.rollout.env_mask is not None else [1] * len(ids),
                                      dtype=torch.long) for s, ids in zip(scored, completions_list)],
                        padding_value=1, padding_side="right", pad_to_multiple_of=multiple).to(device)
    if trainer.mask_truncated_completions:
        # TRL's rule (the last token is neither EOS nor pad), or the agent loop's own flag: the streamed pass's rule
        eos_and_pad = [*trainer.eos_token_ids, pad_id]
        is_truncated = torch.tensor([s.rollout.truncated if s.rollout.truncated is not None
                                     else bool(ids) and ids[-1] not in eos_and_pad
                                     for s, ids in zip(scored, completions_list)], device=device)
        completion_mask = completion_mask * (~is_truncated).unsqueeze(1).int()
        if tool_mask is not None:
            tool_mask = tool_mask * (~is_truncated).unsqueeze(1).int()
    scored_mask = completion_mask if tool_mask is None else completion_mask * tool_mask
    num_items_in_batch = trainer.accelerator.gather(scored_mask.sum()).sum()
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    keep = completion_ids.size(1)
    batch_size = trainer.args.per_device_train_batch_size
    out = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
           "completion_mask": completion_mask,
           "advantages": torch.tensor(advantages, dtype=torch.float32, device=device),
           "num_items_in_batch": num_items_in_batch}
    if tool_mask is not None:
        out["tool_mask"] = tool_mask
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        out["old_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention_mask, keep, batch_size=batch_size)[0]
        if trainer.beta != 0.0:
            out["ref_per_token_logps"] = reference_logps(trainer, ids, attention_mask, keep, batch_size)
    correction = SamplingCorrection.from_config(trainer.args)
    if all(s.rollout.sampling_logprobs is not None for s in scored):
        sampling = [torch.tensor([float("nan") if x is None else x for x in s.rollout.sampling_logprobs])
                    for s in scored]
        out["sampling_per_token_logps"] = pad(sampling, padding_value=0.0, padding_side="right",
                                              pad_to_multiple_of=multiple).to(device)
    if correction is not None:
        if "sampling_per_token_logps" not in out:
            raise ConfigurationError("the vLLM importance-sampling correction of passes 2..num_iterations needs the "
                                     "sampler's log-prob of every completion token; set "
                                     "vllm_importance_sampling_correction=False or num_iterations=1")
        # TRL's ratio (`_generate_and_score_completions`): the same formula as the streamed pass's per-trajectory weight
        out["importance_sampling_ratio"] = correction.weights(out["old_per_token_logps"],
                                                              out["sampling_per_token_logps"], scored_mask)
    return out


def reference_logps(trainer: Any, ids, mask, keep, batch_size: int) -> torch.Tensor:
    """TRL's reference log-probs over the padded batch: the reference model, or (PEFT) the policy with its adapter
    disabled / the 'ref' adapter."""
    from trl.trainer.grpo_trainer import use_adapter

    if trainer.ref_model is not None:
        return trainer._get_per_token_logps_and_entropies(trainer.ref_model, ids, mask, keep, batch_size=batch_size)[0]
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
        return trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=batch_size)[0]
