"""`num_iterations > 1`: pass 1 over a generation batch streams, passes 2..μ run as `trl.GRPOTrainer` runs them.

TRL 1.16 reuses each generation batch for μ = `num_iterations` optimizer steps (its `RepeatSampler` repeats the
batch's rows μ·`steps_per_generation` times; `_prepare_inputs` generates when `_step % (steps_per_generation·μ)` is 0
and otherwise returns `_buffered_inputs[_step % steps_per_generation]`: the same shuffled micro-batches every pass).
Pass 1 runs at θ_k, where TRL's ratio exp(logp − old) is 1 and clipping is inactive: that is the direction ThunderSync
streams during the rollouts. Passes 2..μ run at θ_{k+1}, …, θ_{k+μ-1} with PPO clipping against θ_k's log-probs, so
they need the updated parameters and cannot be streamed. They run TRL's own code: after the streamed pass,
`buffer_generation_batch` returns TRL-format micro-batches for `_buffered_inputs` (what
`_generate_and_score_completions` returns for the batch's scored trajectories; θ_k's and the reference's log-probs are
kept from the streamed pass's own forwards, `RecordedLogProbs`, and computed as TRL computes them for rows it never
forwarded), and each later micro-step (`replays`) is the trainer's `_replay_step`, i.e. `GRPOTrainer.training_step`
(TRL's `_prepare_inputs`, `compute_loss`, backward; TRL's loop clips and steps). θ is published once per generation
batch, after its last pass (`publishes_after`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from trl.trainer.utils import pad, split_tensor_dict

from ...errors import ConfigurationError
from .settings import GRPOSettings


def replays(step: int, args: Any, buffered: Any) -> bool:
    """Whether micro-step `step` (TRL's `_step`) is a pass 2..μ over the buffered generation batch (`buffered`:
    TRL's `_buffered_inputs`), run by TRL's own training_step."""
    spg = args.steps_per_generation
    return args.num_iterations > 1 and (step // spg) % args.num_iterations != 0 and buffered is not None


def publishes_after(global_step: int, num_iterations: int) -> bool:
    """θ goes to the rollout engine once per generation batch: after the step of its last pass (TRL syncs its vLLM
    weights only when it generates, i.e. every num_iterations optimizer steps)."""
    return global_step % num_iterations == 0


class RecordedLogProbs:
    """θ_k's and the reference's per-token log-probs [C_i] of each trajectory, kept (detached) from the streamed pass's
    own forwards and keyed by the trajectory's token ids, so passes 2..μ need no second forward over the batch."""

    def __init__(self) -> None:
        self.policy: dict[tuple[int, ...], torch.Tensor] = {}
        self.reference: dict[tuple[int, ...], torch.Tensor] = {}

    def wrap(self, backward: Any) -> RecordedLogProbs:
        """Record what a `TrajectoryBackward`'s log-prob functions return (turn-level backwards record nothing)."""
        backward.logps_fn = self._recording(backward.logps_fn, self.policy)
        if backward.ref_logps_fn is not None:
            backward.ref_logps_fn = self._recording(backward.ref_logps_fn, self.reference)
        return self

    @staticmethod
    def _recording(fn, store: dict):
        def recorded(ids, mask, keep):
            out = fn(ids, mask, keep)
            store[tuple(ids[0].tolist())] = out.detach()[0]
            return out

        return recorded


@dataclass(frozen=True)
class ReplayModels:
    """What TRL's buffered batch needs from the trainer, as explicit callables."""

    policy_logps: Callable[..., torch.Tensor]  # (ids, mask, keep, batch_size) → θ_k's per-token log-probs [B, C]
    reference_logps: Callable[..., torch.Tensor]  # the same for TRL's reference (`reference_logps`)
    gather: Callable[[torch.Tensor], torch.Tensor]  # every process's tensor, concatenated (accelerator.gather)
    no_checkpointing: Callable[[], Any]  # a context without gradient checkpointing (TRL's, for its forwards)


def replay_models(forward, model, ref_model, accelerator, checkpointing_kwargs) -> ReplayModels:
    """TRL's forwards over the buffered batch (`forward`: TRL's `_get_per_token_logps_and_entropies`, `model` and
    `ref_model` TRL's, `accelerator` for its gather and unwrapping, `checkpointing_kwargs` TRL's
    `gradient_checkpointing_kwargs`)."""
    from trl.models.utils import disable_gradient_checkpointing

    def policy(ids, mask, keep, batch_size):
        return forward(model, ids, mask, keep, batch_size=batch_size)[0]

    def reference(ids, mask, keep, batch_size):
        return reference_logps(forward, ref_model, model, accelerator.unwrap_model(model), ids, mask, keep,
                               batch_size)

    return ReplayModels(policy, reference, accelerator.gather,
                        lambda: disable_gradient_checkpointing(model, checkpointing_kwargs))


def buffer_generation_batch(settings: GRPOSettings, models: ReplayModels, scored, advantages: list[float],
                            permutation: list[int], recorded: RecordedLogProbs | None = None) -> list[dict]:
    """TRL's `_buffered_inputs` for passes 2..μ: the batch as `_generate_and_score_completions` returns it, shuffled
    with the permutation the streamed pass used (TRL's `shuffle_sequence_dict`) and split into micro-batches."""
    batch = generation_batch(settings, models, sorted(scored, key=lambda s: s.rollout.index), advantages, recorded)
    index = torch.tensor(permutation)
    shuffled = {k: (v if v.ndim == 0 else v[index.to(v.device)]) for k, v in batch.items()}
    return split_tensor_dict(shuffled, settings.args.steps_per_generation)


def generation_batch(settings: GRPOSettings, models: ReplayModels, scored, advantages: list[float],
                     recorded: RecordedLogProbs | None = None) -> dict[str, torch.Tensor]:
    """What TRL's `_generate_and_score_completions` returns for these trajectories (rows in batch order, text only):
    padded ids and masks [B, P] / [B, C], the tool mask [B, C] (agent trajectories), advantages [B],
    `num_items_in_batch` (scored tokens on all processes), θ_k's and the reference's per-token log-probs [B, C], and,
    when they are known, the sampler's log-probs [B, C] with TRL's vLLM importance-sampling ratio when that correction
    is on. Log-probs the streamed pass recorded are reused; the other rows are computed over the padded batch in
    chunks of per_device_train_batch_size, as TRL computes them."""
    out = padded_tokens(settings, scored)
    scored_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
    out["advantages"] = torch.tensor(advantages, dtype=torch.float32, device=settings.device)
    out["num_items_in_batch"] = models.gather(scored_mask.sum()).sum()
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    attention_mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    keep, batch_size = out["completion_ids"].size(1), settings.args.per_device_train_batch_size
    recorded = recorded or RecordedLogProbs()
    keys = [tuple(s.rollout.prompt_ids) + tuple(s.rollout.completion_ids) for s in scored]

    def policy(rows):
        return models.policy_logps(ids[rows], attention_mask[rows], keep, batch_size)

    def reference(rows):
        return models.reference_logps(ids[rows], attention_mask[rows], keep, batch_size)

    with torch.no_grad(), models.no_checkpointing():
        # padding positions (never scored: every use in TRL's loss is masked) get values that keep each masked term
        # finite: old = 0 (the ratio exp(logp − old) ≤ 1) and ref = −1e4 (the KL's exp(ref − logp) is 0, not inf)
        out["old_per_token_logps"] = logps_rows(recorded.policy, keys, policy, ids.new_zeros(0), keep, 0.0)
        if settings.beta != 0.0:
            out["ref_per_token_logps"] = logps_rows(recorded.reference, keys, reference, ids.new_zeros(0), keep,
                                                    -1e4)
    if all(s.rollout.sampling_logprobs is not None for s in scored):
        sampling = [torch.tensor([float("nan") if x is None else x for x in s.rollout.sampling_logprobs])
                    for s in scored]
        out["sampling_per_token_logps"] = pad(sampling, padding_value=0.0, padding_side="right",
                                              pad_to_multiple_of=settings.pad_to_multiple_of).to(ids.device)
    correction = settings.correction
    if correction is not None:
        if "sampling_per_token_logps" not in out:
            raise ConfigurationError("the vLLM importance-sampling correction of passes 2..num_iterations needs the "
                                     "sampler's log-prob of every completion token; set "
                                     "vllm_importance_sampling_correction=False or num_iterations=1")
        # TRL's ratio: the formula of the streamed pass's per-trajectory weight, over the padded batch
        out["importance_sampling_ratio"] = correction.weights(out["old_per_token_logps"],
                                                              out["sampling_per_token_logps"], scored_mask)
    return out


def logps_rows(store: dict, keys: list, forward, like: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """[B, width] log-probs: row i from `store[keys[i]]` where the streamed pass recorded it (then `fill` beyond its
    length), else from `forward(rows)` over the padded rows no forward recorded."""
    missing = [i for i, key in enumerate(keys) if key not in store]
    computed = forward(missing) if missing else None
    dtype = computed.dtype if computed is not None else next(iter(store.values())).dtype  # TRL's: the model's logps
    out = torch.full((len(keys), width), fill, dtype=dtype, device=like.device)
    for i, key in enumerate(keys):
        if key in store:
            out[i, : store[key].numel()] = store[key]
    if computed is not None:
        out[missing] = computed
    return out


def padded_tokens(settings: GRPOSettings, scored) -> dict[str, torch.Tensor]:
    """TRL's padding of prompts (left) and completions (right), its tool mask (1 = model token, padded with 1) and
    `mask_truncated_completions` (whole rows zeroed; truncation decided as the streamed pass decides it: the agent
    loop's own flag, else TRL's rule that the last token is neither EOS nor pad)."""
    device, pad_id, multiple = settings.device, settings.pad_token_id, settings.pad_to_multiple_of

    def padded(rows, value, side):
        return pad([torch.tensor(r, dtype=torch.long) for r in rows], padding_value=value, padding_side=side,
                   pad_to_multiple_of=multiple).to(device)

    prompts = [list(s.rollout.prompt_ids) for s in scored]
    completions = [list(s.rollout.completion_ids) for s in scored]
    out = {"prompt_ids": padded(prompts, pad_id, "left"),
           "prompt_mask": padded([[1] * len(p) for p in prompts], 0, "left"),
           "completion_ids": padded(completions, pad_id, "right"),
           "completion_mask": padded([[1] * len(c) for c in completions], 0, "right")}
    if settings.agentic or any(s.rollout.env_mask is not None for s in scored):
        out["tool_mask"] = padded([s.rollout.env_mask if s.rollout.env_mask is not None else [1] * len(c)
                                   for s, c in zip(scored, completions, strict=True)], 1, "right")
    if settings.mask_truncated:
        eos_and_pad = list(settings.eos_and_pad)
        truncated = torch.tensor([s.rollout.truncated if s.rollout.truncated is not None
                                  else bool(c) and c[-1] not in eos_and_pad
                                  for s, c in zip(scored, completions, strict=True)],
                                 device=device)
        for key in ("completion_mask", "tool_mask"):
            if key in out:
                out[key] = out[key] * (~truncated).unsqueeze(1).int()
    return out


def reference_logps(forward, ref_model, model, unwrapped, ids, mask, keep, batch_size: int) -> torch.Tensor:
    """TRL's reference log-probs over the padded batch (`forward`: TRL's `_get_per_token_logps_and_entropies`): the
    reference model, or (PEFT, `ref_model` None) the policy `model` with its adapter (on `unwrapped`) disabled / the
    'ref' adapter."""
    from trl.trainer.grpo_trainer import use_adapter

    if ref_model is not None:
        return forward(ref_model, ids, mask, keep, batch_size=batch_size)[0]
    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
        return forward(model, ids, mask, keep, batch_size=batch_size)[0]
