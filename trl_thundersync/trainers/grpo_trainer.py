"""`ThunderSyncGRPOTrainer`: `trl.GRPOTrainer` with zero-staleness gradient streaming.

Swap `GRPOTrainer`/`GRPOConfig` for `ThunderSyncGRPOTrainer`/`ThunderSyncGRPOConfig`; nothing else changes. The
first micro-step of every generation batch runs the whole logical batch through `streaming.pipeline`: rollouts at
θ_k, each trajectory scored and back-propagated as soon as it finishes, group statistics folded as groups close,
and at the barrier the fully normalized batch direction is written into `param.grad`. TRL's own loop then clips it
and takes the one optimizer step; a callback publishes θ_{k+1} to the rollout engine and waits for its ack.
The trainer only wires parts together; the math lives in `trl_thundersync.streaming`. With num_iterations = μ > 1,
passes 2..μ over the batch run TRL's own training step on the buffered batch (`grpo_iterations`).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import replace

import torch
import transformers
from accelerate.logging import get_logger
from packaging.version import Version
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import parse_response
from trl.data_utils import apply_chat_template, is_conversational
from trl.trainer.utils import get_config_model_id, nanstd

from ..errors import ConfigurationError, NonFiniteGradientError, UnsupportedOptionError
from ..envs.metrics import agent_metrics, completion_metrics, model_token_counts
from ..rollout.agent_setup import make_agent_engine
from ..rollout.batches import as_rollout_engine
from ..rollout.engine import RolloutEngine, TurnGenerator, engine_step_metrics
from ..rollout.trl_batch import TRLBatchEngine
from ..streaming.accumulators import stats_memory_bytes
from ..streaming.grading import grading_workers
from ..streaming.learner import BatchTotals, GRPOBatchLearner
from ..streaming.normalization import LossNormalization, micro_batch_of
from ..streaming.pipeline import BatchTiming, TurnRouter, run_logical_batch
from ..streaming.reward_scope import RewardStage, ScopeProbe, plain_reward_functions
from ..streaming.rewards import RewardContext, RewardScorer, ScoringInput
from ..streaming.source import write_flat_grads
from ..streaming.unscorable import unscorable_warning
from ..trace.recorder import build_step_trace, open_run_trace
from ..types import Rollout, RolloutRequest, SamplingParams
from .grpo_backward import router_aux_loss, trajectory_backward, turn_backward
from .grpo_config import ThunderSyncGRPOConfig
from .lifecycle import PublishCallback, trajectory_seed  # noqa: F401  (trajectory_seed: re-exported)
from .grpo_entropy import add_entropy_direction, entropy_barrier, entropy_batch
from . import grpo_iterations
from .rollout_setup import RolloutTarget, build_turn_generator, check_turn_generator

logger = get_logger(__name__)

class _RolloutProgress:
    """A per-batch progress bar: trajectories scored, turns, tool calls and the running mean reward."""

    def __init__(self, total: int, version: int, disable: bool) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=f"rollouts @v{version}", leave=False, disable=disable, dynamic_ncols=True)
        self.turns = self.calls = 0
        self.rewards: list[float] = []

    def update(self, source) -> None:
        agent = source.rollout.agent
        if agent is not None:
            self.turns += agent.turns
            self.calls += agent.tool_calls
        if source.scorable:
            self.rewards.append(source.reward)
        postfix = {"reward": f"{sum(self.rewards) / len(self.rewards):.3g}" if self.rewards else "-"}
        if agent is not None:
            postfix.update(turns=self.turns, tool_calls=self.calls)
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _thundersync_args(model, args) -> ThunderSyncGRPOConfig:
    """`args` with TRL's meaning: None is TRL's default config named after the model, a plain `trl.GRPOConfig` is
    converted (`ThunderSyncGRPOConfig.from_trl`); anything else is refused."""
    if args is None:
        model_name = model if isinstance(model, str) else get_config_model_id(model.config)
        return ThunderSyncGRPOConfig(output_dir=f"{model_name.split('/')[-1]}-GRPO")
    if isinstance(args, ThunderSyncGRPOConfig):
        return args
    if isinstance(args, GRPOConfig):
        return ThunderSyncGRPOConfig.from_trl(args)
    raise UnsupportedOptionError(
        f"args is a {type(args).__name__}; pass a ThunderSyncGRPOConfig or a trl.GRPOConfig so unsupported options "
        "are checked")


class ThunderSyncGRPOTrainer(GRPOTrainer):
    """Drop-in for `trl.GRPOTrainer` (same constructor); see the module docstring.

    The rollout side is pluggable: `use_turn_generator(generator)` (before `train()`) samples with any
    `TurnGenerator` instead of the engine the config's rollout fields would build; `rollout_engine` is the engine
    the trainer samples with.
    """

    _tag_names = ["trl", "grpo", "thundersync"]

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, eval_dataset=None,
                 processing_class=None, reward_processing_classes=None, callbacks=None, optimizers=(None, None),
                 quantization_config=None, peft_config=None, tools=None, rollout_func=None,
                 environment_factory=None):
        args = _thundersync_args(model, args)
        # With use_vllm=True, TRL would connect its own vLLM client here (and import vllm); ThunderSync's rollout
        # engine talks to the servers itself, so TRL is built as for local generation (evaluation generates locally).
        use_vllm, args.use_vllm = args.use_vllm, False
        # TRL appends each environment's get_reward after the user's functions (into the same list object)
        num_user_rewards = 0 if reward_funcs is None else len(reward_funcs) if isinstance(reward_funcs, list) else 1
        try:
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                             eval_dataset=eval_dataset, processing_class=processing_class,
                             reward_processing_classes=reward_processing_classes, callbacks=callbacks,
                             optimizers=optimizers, quantization_config=quantization_config,
                             peft_config=peft_config, tools=tools, rollout_func=rollout_func,
                             environment_factory=environment_factory)
        finally:
            args.use_vllm = use_vllm
        self._check_distributed()
        if self._agentic() and (rollout_func is not None or args.rollout_engine == "trl"):
            raise UnsupportedOptionError(
                "tools / environment_factory run in ThunderSync's streamed agent loop; they cannot be combined with "
                "rollout_func or rollout_engine='trl'"
            )
        if rollout_func is not None and args.resolved_rollout_engine(True) in ("vllm_server", "embedded_server"):
            raise UnsupportedOptionError(
                "rollout_func generates with TRL's own batch generation; it cannot be combined with use_vllm=True or "
                "rollout_engine='embedded_server' (ThunderSync's server engine)"
            )
        self._refuse_dropped_generation_fields()
        # MoE models (`self.aux_loss_enabled`, TRL's rule): the router load-balancing term is streamed exactly, one
        # deferred backward per TRL micro-batch (`streaming/moe_aux.py`, `grpo_backward.router_aux_loss`)
        self.policy_version = 0
        self._engine: RolloutEngine | None = None
        self._turns = TurnRouter(required=False)  # agent turns → the open batch's learner (release="turn")
        self._open_step: tuple[int, list] | None = None  # (version, scored sources) awaiting the step's trace
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.last_batch: tuple[BatchTotals, BatchTiming] | None = None
        self.last_trace = None  # StepTrace of the latest optimizer step
        self.last_off_policy_dropped: tuple[int, ...] = ()  # rows TRL's off-policy mask dropped in the last batch
        self._pending_extra_rows: defaultdict[str, dict] = defaultdict(dict)  # log_extra: column → {trajectory: value}
        self._scope_probe = ScopeProbe(plain_reward_functions(self.reward_funcs, num_user_rewards))  # once per run
        self._environment_rewards = tuple(range(num_user_rewards, len(self.reward_funcs)))  # TRL's get_reward wrappers
        self.add_callback(PublishCallback(self))

    def _refuse_dropped_generation_fields(self) -> None:
        """TRL forwards these into its own generation; ThunderSync's engines do not have them yet (refused by name)."""
        if self._uses_trl_generation():
            return
        for name in ("generation_kwargs", "vllm_structured_outputs_regex"):
            value = getattr(self.args, name)
            if value:
                raise UnsupportedOptionError(
                    f"{name}={value!r}: ThunderSync's rollout engine (rollout_engine="
                    f"{self.args.resolved_rollout_engine(False)!r}) does not forward it to generation, so the samples "
                    "would not be what TRL would draw; leave it unset (temperature, top_p, top_k, min_p and "
                    "repetition_penalty are forwarded), or generate with TRL's own generation (rollout_engine='trl')")

    def _check_distributed(self) -> None:
        from accelerate.utils import DistributedType

        kind = self.accelerator.distributed_type
        if kind in (DistributedType.DEEPSPEED, DistributedType.FSDP):
            raise UnsupportedOptionError(
                f"{kind.value}: ThunderSync writes the reduced batch direction into param.grad itself, which sharded "
                "gradients do not allow yet; use DDP or a single process"
            )
        local_rows = self.args.per_device_train_batch_size * self.args.steps_per_generation
        if self.accelerator.num_processes > 1 and local_rows % self.num_generations:
            raise ConfigurationError(
                f"per_device_train_batch_size × steps_per_generation = {local_rows} is not a multiple of "
                f"num_generations={self.num_generations}: with {self.accelerator.num_processes} processes every "
                "GRPO group must live on one process so it can close there; change per_device_train_batch_size"
            )

    # -- TRL hook: the learner side -----------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        if grpo_iterations.replays(self):  # passes 2..μ of num_iterations: TRL's own step on the buffered batch
            return grpo_iterations.replay_step(self, model, inputs, num_items_in_batch)
        started = time.perf_counter()
        model.train()
        if self._step % self.args.steps_per_generation == 0:
            loss = self._run_logical_batch(model, inputs)
            if self.args.num_iterations > 1:  # TRL-format micro-batches (θ_k log-probs) for passes 2..μ
                grpo_iterations.buffer_generation_batch(self, self._open_step[1], self._last_advantages,
                                                        self._permutation,
                                                        self._recorded_logps)
        else:  # the batch direction is already in param.grad; later micro-steps of the window add nothing
            loss = torch.zeros((), device=self.args.device)
        self._step += 1
        self._current_train_step_time += time.perf_counter() - started
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return loss

    def _run_logical_batch(self, model, rows: list[dict]) -> torch.Tensor:
        version = self.state.global_step
        if version != self.policy_version:
            self._publish(version)
        permutation = torch.randperm(len(rows)).tolist()  # TRL's shuffle-then-split, drawn at the same RNG point
        self._permutation = permutation  # TRL's micro-batches, reused by passes 2..μ (num_iterations > 1)
        normalization = LossNormalization.from_config(self.args, len(rows), self.accelerator.num_processes)
        buckets = micro_batch_of(permutation, self.args.steps_per_generation) if normalization.uses_buckets else None
        prompts = self._prompts(rows)
        requests = self._requests(rows, prompts, version)
        engine = self._rollout_engine()
        # Per-source passes run on the unwrapped module: DDP's reducer must not see them. The batch direction is
        # averaged across processes once, at the barrier (what DDP's all-reduce would have produced).
        module = self.accelerator.unwrap_model(model)
        self._entropy_batch = entropy = entropy_batch(self, permutation)  # TRL's entropy bonus (None: off)
        entropy_coef = entropy.coef if entropy is not None else None
        backward = trajectory_backward(self, module, normalization, entropy_coef)
        if self.args.num_iterations > 1:  # θ_k's log-probs for passes 2..μ, kept from the streamed forwards
            self._recorded_logps = grpo_iterations.RecordedLogProbs().wrap(backward)
        learner = GRPOBatchLearner(
            batch_size=len(rows), num_generations=self.num_generations,
            num_params=sum(p.numel() for p in self._trainable), policy_version=version,
            scale_rewards=self.scale_rewards, source_backward=backward,
            bucket_of=(lambda i: buckets[i]) if buckets else (lambda i: 0),
            max_open_groups=self.args.max_open_groups,
            allow_unscorable_groups=self.args.allow_unscorable_groups, device=self.accelerator.device,
            release=self._release(), content_backward=backward.content,
            turn_source=(turn_backward(self, module, normalization, entropy_coef) if self._release() == "turn"
                         else None),
            max_buffered=self.args.max_buffered_trajectories, router_aux=router_aux_loss(self, module, permutation),
            entropy_micro_batch_of=entropy.micro_batch.__getitem__ if entropy is not None else None,
            off_policy_threshold=self.args.off_policy_mask_threshold, objective_weights=self._objective_weights(),
        )
        def prepare(rollout: Rollout) -> ScoringInput:
            if rollout.completion is None:  # engines that return tokens only: decode exactly as TRL does
                completion = self._decode(prompts[rollout.index], rollout.prompt_ids, rollout.completion_ids)
                rollout = replace(rollout, completion=completion)
            environments = getattr(engine, "environments", None)  # built by the engine for this batch
            return ScoringInput(rollout, prompts[rollout.index], rows[rollout.index],
                                environments[rollout.index] if environments else None)

        rewards = RewardStage(self._reward_scorer(), self.args.reward_scope, batch_size=len(rows),
                              num_generations=self.num_generations, prepare=prepare, probe=self._scope_probe,
                              context=RewardContext(self.state, self._log_extra_rows, self._log_metric),
                              environment_rewards=self._environment_rewards,
                              grading_workers=grading_workers(self.args.grading_workers, len(rows)))
        scored = []
        progress = _RolloutProgress(len(rows), version, disable=self.args.disable_tqdm
                                    or not self.accelerator.is_local_main_process)

        def on_source(source):
            scored.append(source)
            progress.update(source)

        try:
            totals, timing = run_logical_batch(engine, requests, version, rewards.add, learner, self.args.schedule,
                                               on_source=on_source, turns=self._turns,
                                               grade=rewards.start if rewards.grades_ahead else None)
        finally:
            rewards.close()
            progress.close()
        self.last_batch = (totals, timing)
        self._open_step = (version, scored)
        ordered = sorted(scored, key=lambda s: s.rollout.index)
        warning = unscorable_warning([prepare(s.rollout) for s in ordered], ordered)
        if warning is not None:  # TRL's warning, once per generation batch (the row then gets zero advantage)
            logger.warning(warning)
        return self._barrier(totals, timing, normalization, buckets, ordered, prompts)

    def _objective_weights(self) -> tuple[float, ...] | None:
        """normalize_then_sum: the reward weights its per-function group statistics use (None: sum_then_normalize)."""
        if self.args.multi_objective_aggregation != "normalize_then_sum":
            return None
        return tuple(float(w) for w in self.reward_weights.tolist())

    def _release(self) -> str:
        """The release point in effect: 'turn' needs turn events, which only multi-turn agent engines emit."""
        if self.args.release == "turn" and not self._agentic():
            return "content"
        return self.args.release

    def _stats_bound(self, totals, batch_size: int) -> int:
        """Memory bound of the streamed statistics: 4·(2k+1)·P, plus 4·m·P of release buffers (m the buffer cap)."""
        num_params = totals.accumulator.num_params
        bound = stats_memory_bytes(num_params, self.args.max_open_groups or batch_size // self.num_generations)
        if self._release() != "reward":  # one H_i per buffered trajectory (and K_i / E_i under 'turn': β, coef ≠ 0)
            vectors = 2 if self._release() == "turn" and self.beta != 0.0 else 1
            if self._release() == "turn" and totals.entropy_terms is not None:
                vectors += 1
            bound += 4 * vectors * num_params * min(self.args.max_buffered_trajectories or batch_size, batch_size)
        if totals.router_aux is not None:  # the MoE router term's batch buffer
            bound += 4 * num_params
        if totals.entropy_terms is not None:  # the entropy bonus: one buffer per TRL micro-batch
            bound += 4 * self.args.steps_per_generation * num_params
        open_groups = self.args.max_open_groups or batch_size // self.num_generations
        if totals.objective_rewards is not None:  # normalize_then_sum: 2K+1 vectors per open group, +Q in the batch
            bound += 4 * num_params * (2 * len(self.reward_funcs) * open_groups + 1)
        if self.args.off_policy_mask_threshold is not None:  # masked H_i held until the sign of A_i is known
            held = batch_size if totals.objective_rewards is not None else open_groups * self.num_generations
            bound += 4 * num_params * min(held, batch_size)
        return bound

    def _barrier(self, totals, timing, normalization, buckets, scored, prompts) -> torch.Tensor:
        tokens = totals.scored_tokens
        per_bucket: dict[int, int] = defaultdict(int)
        for index, n in enumerate(tokens):
            per_bucket[buckets[index] if buckets else 0] += n
        global_tokens = int(self.accelerator.reduce(torch.tensor(sum(tokens), device=self.accelerator.device),
                                                    reduction="sum").item())
        scales = normalization.bucket_scales(dict(per_bucket), global_tokens)
        policy_offset = 0.0
        if totals.objective_rewards is not None:
            advantages, policy_scale, policy_offset, zero_std_fraction = self._objective_advantages(totals)
        else:
            advantages, policy_scale, zero_std_fraction = self._advantages(totals)
        self._last_advantages = advantages  # TRL's per-row advantages of this batch (passes 2..μ of num_iterations)
        dropped = list(totals.off_policy_dropped)
        for index, bucket, vector in totals.deferred:  # off-policy masked rows whose sign needed the batch mean
            if advantages[index] < 0:
                dropped.append(index)
            else:
                totals.accumulator.add_final(vector, advantages[index], bucket)
        self.last_off_policy_dropped = tuple(sorted(dropped))
        direction = totals.accumulator.direction(scales, policy_scale, policy_offset)
        if totals.router_aux is not None:  # coef·aux_b/GA per micro-batch: already final, no barrier scalar
            direction.add_(totals.router_aux.direction)
        entropy = self._entropy_batch if totals.entropy_terms is not None else None
        if entropy is not None:  # −coef·Σ_{i∈b} ∇Σ_t m H / (max(N_b, 1)·GA), before DDP's average
            entropy_tokens = add_entropy_direction(entropy, totals, direction)
        if self.accelerator.num_processes > 1:
            direction = self.accelerator.reduce(direction, reduction="mean")
        if not torch.isfinite(direction).all():
            raise NonFiniteGradientError(
                f"the batch direction of optimizer step {self.state.global_step} (policy version "
                f"{self.policy_version}) contains NaN/inf; the step is refused"
            )
        write_flat_grads(direction, self._trainable)
        self._log_batch(totals, timing, scored, advantages, prompts)
        self._metrics["train"]["frac_reward_zero_std"].append(zero_std_fraction)
        terms = self._policy_loss_terms(totals, advantages, scales, buckets, normalization, dropped)
        loss = sum(terms)
        if self.beta != 0.0:
            self._metrics["train"]["kl"].append(sum(totals.kl_sums) / max(sum(tokens), 1))
        if entropy is not None:  # the bonus's value and metrics; per-trajectory policy terms for `policy_loss`
            loss += entropy_barrier(self, entropy, totals, entropy_tokens, terms)
        if totals.router_aux is not None:
            loss += totals.router_aux.loss
            self._log_router_aux(totals.router_aux.values)
        return torch.tensor(loss, device=self.args.device)

    def _policy_loss_terms(self, totals, advantages, scales, buckets, normalization, dropped) -> list[float]:
        """The loss value TRL reports, per trajectory: s_b·(free_i − A_i·g(A_i)·V_i) (ratio ≡ 1).

        V_i = Σ_t m_it u_i c_it h_it (times cispo's min(1, ε_high)) comes with the trajectory's backward
        (`streaming/source.py`); g = 2/τ_± for sapo (TRL's 4σ(0)/τ, τ by the sign of A_i), else 1. A row the
        off-policy mask dropped has no policy value (TRL multiplies its policy loss by 0)."""
        dropped = set(dropped)
        terms = []
        for index, n in enumerate(totals.scored_tokens):
            value = totals.policy_values[index] if index < len(totals.policy_values) else None
            if value is None:  # a backward that reports none: TRL's grpo-like value Σ_t m_it u_i
                value = n * normalization.sequence_weight(n)
            advantage = advantages[index]
            if self.loss_type == "sapo":
                tau = self.args.sapo_temperature_pos if advantage > 0 else self.args.sapo_temperature_neg
                value *= 2.0 / tau
            if index in dropped:
                value = 0.0
            scale = scales[buckets[index] if buckets else 0]
            terms.append(scale * (totals.free_values[index] - advantage * value))
        return terms

    def _log_router_aux(self, values) -> None:
        """TRL's `aux_loss` metric: one entry per micro-batch, each the mean over processes of that micro-batch's."""
        local = torch.tensor(values, dtype=torch.float32, device=self.accelerator.device)
        gathered = self.accelerator.gather(local).view(-1, len(values)).mean(dim=0)
        self._metrics["train"]["aux_loss"].extend(gathered.tolist())

    def _advantages(self, totals: BatchTotals) -> tuple[list[float], float, float]:
        """Per-trajectory advantages (for logs and the loss value), the barrier-time policy scale, and the fraction
        of trajectories whose σ is zero (TRL's `frac_reward_zero_std`)."""
        g = self.num_generations
        rewards = torch.tensor(totals.rewards, dtype=torch.float32)
        means = torch.tensor(totals.group_means, dtype=torch.float32).repeat_interleave(g)
        if self.scale_rewards == "batch":
            everyone = self.accelerator.gather(rewards.to(self.accelerator.device)).cpu()
            sigma = float(nanstd(everyone)) if everyone.numel() > 1 else 0.0
            policy_scale = 1.0 / (sigma + 1e-4)
            std = torch.full_like(rewards, sigma)
        else:
            policy_scale = 1.0
            std = torch.tensor(totals.group_stds, dtype=torch.float32).repeat_interleave(g)
        adv = rewards - means
        if self.scale_rewards != "none":
            adv = adv / (std + 1e-4)
        # TRL's isclose: a NaN σ (a group with fewer than two scorable members) does not count as zero
        zero_std = float(torch.isclose(std, torch.zeros_like(std)).float().mean())
        if not math.isfinite(policy_scale):
            policy_scale = 0.0
        return torch.nan_to_num(adv, nan=0.0).tolist(), policy_scale, zero_std

    def _objective_advantages(self, totals: BatchTotals) -> tuple[list[float], float, float, float]:
        """normalize_then_sum: TRL's A_i = (R_i − μ_B)/(σ_B + 1e-4) over the whole (gathered) batch of group-normalized
        R_i (`scale_rewards` is not used, as in TRL); also 1/(σ_B + 1e-4), μ_B and `frac_reward_zero_std`."""
        rewards = torch.tensor(totals.objective_rewards, dtype=torch.float32)
        everyone = self.accelerator.gather(rewards.to(self.accelerator.device)).cpu()
        sigma = nanstd(everyone) if everyone.numel() > 1 else torch.zeros(())
        mean = torch.nanmean(everyone)
        adv = (rewards - mean) / (sigma + 1e-4)
        zero_std = float(torch.isclose(sigma, torch.zeros_like(sigma)).float())
        policy_scale, offset = 1.0 / (float(sigma) + 1e-4), float(mean)
        if not (math.isfinite(policy_scale) and math.isfinite(offset)):
            policy_scale, offset = 0.0, 0.0
        return torch.nan_to_num(adv, nan=0.0).tolist(), policy_scale, offset, zero_std

    # -- rollouts ---------------------------------------------------------------------------------------------------
    def _prompts(self, rows: list[dict]) -> list:
        if self.environment_factories is not None:
            return [x.get("prompt", [{"role": "user", "content": ""}]) for x in rows]
        return [x["prompt"] for x in rows]

    def _uses_trl_generation(self) -> bool:
        return self.rollout_func is not None or self.args.resolved_rollout_engine(False) == "trl"

    def _agentic(self) -> bool:
        return bool(self.tools) or self.environment_factories is not None

    def _requests(self, rows: list[dict], prompts: list, version: int) -> list[RolloutRequest]:
        if self._uses_trl_generation() or self._agentic():
            prompt_ids = [()] * len(rows)  # tokenized by TRL's generation / after the environment's reset
        else:
            prompt_ids = self._tokenize_prompts(prompts)[0]
        g = self.num_generations
        first_row = self.accelerator.process_index * len(rows)  # global row of this process's first trajectory
        return [
            RolloutRequest(index=i, group=i // g, prompt_ids=tuple(prompt_ids[i]),
                           seed=trajectory_seed(self.args.seed, version, first_row + i), prompt=prompts[i],
                           row=rows[i])
            for i in range(len(rows))
        ]

    @property
    def rollout_engine(self) -> RolloutEngine:
        """The `RolloutEngine` this trainer samples with, built on first use (from the config's rollout fields: that
        starts the rollout worker or servers) unless `use_turn_generator` gave one. The trainer publishes every new
        policy version to it and closes it when training ends."""
        return self._rollout_engine()

    def use_turn_generator(self, generator: TurnGenerator) -> RolloutEngine:
        """Sample with `generator` (any `TurnGenerator`: `submit`, `publish`, `policy_version`, `close`; lifecycle in
        `rollout/engine.py`) instead of the engine the config's rollout fields would build. Call it before `train()`,
        with the generator serving the trainer's `policy_version`. With `tools` / `environment_factory` the agent loop
        drives it one request per turn, else one request per trajectory; the engine built around it is returned. The
        trainer owns the generator from then on (publishes to it, closes it). Not with `rollout_func` or
        `rollout_engine='trl'`, which generate with TRL's own batch generation."""
        check_turn_generator(self._uses_trl_generation(), built=self._engine is not None)
        self._engine = self._agent_engine(generator) if self._agentic() else as_rollout_engine(generator)
        return self._engine

    def _rollout_engine(self) -> RolloutEngine:
        if self._engine is not None:
            return self._engine
        if self._uses_trl_generation():
            self._engine = TRLBatchEngine(self._generate, policy_version=self.policy_version)
            return self._engine
        sampling = self._sampling_params()
        if self._agentic():
            sampling = replace(sampling, max_new_tokens=self.args.agent_limits().max_tokens_per_turn)
        target = RolloutTarget(self.accelerator.unwrap_model(self.model), self._tokenizer, self.accelerator.device,
                               self.accelerator.num_processes, self.policy_version)
        generator = build_turn_generator(target, self.args, sampling,
                                         on_metric=lambda name, value: self._metrics["train"][name].append(value))
        return self.use_turn_generator(generator)

    def _agent_engine(self, generator: TurnGenerator):
        """The agent loop over `generator`, rendering prompts with TRL's own template choice (`self.chat_template`,
        from the tools TRL collected: `make_agent_engine` applies the same rule to the same tools)."""
        from ..envs.agent_loop import ToolRunner

        return make_agent_engine(
            generator, processing_class=self.processing_class, tokenizer=self._tokenizer,
            limits=self.args.agent_limits(), tools=self._standalone_tools or (),
            environment_factory=self.environment_factories, chat_template_kwargs=self.chat_template_kwargs,
            has_tools=bool(self.tools), tool_runner=ToolRunner(loop=getattr(self, "async_loop", None)),
            on_turn=self._turns, max_concurrent=max(8, self._train_batch_size_local()),
            policy=self.accelerator.unwrap_model(self.model))

    def _train_batch_size_local(self) -> int:
        return self.args.per_device_train_batch_size * self.args.steps_per_generation

    def _sampling_params(self) -> SamplingParams:
        a = self.args
        return SamplingParams(
            max_new_tokens=a.max_completion_length, temperature=a.temperature, top_p=a.top_p,
            top_k=a.top_k or 0, min_p=a.min_p or 0.0, repetition_penalty=a.repetition_penalty,
            eos_token_ids=tuple(self.eos_token_ids), pad_token_id=self._tokenizer.pad_token_id,
        )

    def _record_step(self, optimizer_end: float, publish_end: float) -> None:
        """Close the step's trace: landmarks, learner FLOPs and MFU into the logs, a JSON line on disk."""
        if self._open_step is None or self.last_batch is None:
            return
        (version, scored), (totals, timing) = self._open_step, self.last_batch
        self._open_step = None
        trace = build_step_trace(
            step=version, schedule=self.args.schedule, start=timing.start, rollout_end=timing.rollout_end,
            work=totals.work, scored=scored, optimizer_end=optimizer_end, publish_start=optimizer_end,
            publish_end=publish_end, stats_bytes=totals.peak_stats_bytes, flops_of=self._flops_of(),
            peak_flops_per_s=self.args.peak_flops_per_s or 0.0,
        )
        m = self._metrics["train"]
        learner_flops = sum(e.flops for e in trace.events)
        m["thundersync/step_wall_with_publish_seconds"].append(trace.wall)
        m["thundersync/learner_tflops_per_s"].append(learner_flops / trace.wall / 1e12 if trace.wall else 0.0)
        if self.args.peak_flops_per_s:
            processes = self.accelerator.num_processes
            m["thundersync/trainer_active_mfu"].append(learner_flops / trace.wall / self.args.peak_flops_per_s
                                                       if trace.wall else 0.0)
            m["thundersync/trainer_processes"].append(float(processes))
        if getattr(self, "_trace_writer", None) is not None:
            self._trace_writer.append(trace)
        self.last_trace = trace

    def _flops_of(self):
        from ..trace.flops import ModelShape, learner_flops

        if not hasattr(self, "_flops_fn"):
            unwrapped = self.accelerator.unwrap_model(self.model)
            config = getattr(unwrapped, "config", None)
            try:
                shape = ModelShape.from_config(config)
            except AttributeError:  # not a standard decoder config: no FLOP estimate rather than a wrong one
                self._flops_fn = None
                return None
            adapter = None
            if hasattr(unwrapped, "peft_config"):
                adapter = sum(p.numel() for p in self._trainable)
            self._flops_fn = lambda tokens: learner_flops(shape, tokens, adapter)
        return self._flops_fn

    def _publish_due(self, global_step: int) -> bool:
        """`PublishCallback`: θ goes out after the last pass over a generation batch (`num_iterations`)."""
        return grpo_iterations.publishes_after(global_step, self.args.num_iterations)

    def _publish(self, version: int) -> None:
        if self._engine is not None:
            seconds = self._engine.publish(self.accelerator.unwrap_model(self.model), version)
            self._metrics["train"]["thundersync/publish_seconds"].append(seconds)
        self.policy_version = version

    def _decode(self, prompt, prompt_ids, completion_ids):
        """TRL's completion decoding for one trajectory (parse_response for chat prompts with a response schema)."""
        if is_conversational({"prompt": prompt}):
            tok = self._tokenizer
            if Version(transformers.__version__) >= Version("5.0.0") and (
                getattr(tok, "response_template", None) is not None or getattr(tok, "response_schema", None) is not None
            ):
                return [parse_response(tok, list(completion_ids), prefix=list(prompt_ids), tools=self.tools)]
            text = self.processing_class.decode(list(completion_ids), skip_special_tokens=True)
            return [{"role": "assistant", "content": text}]
        return self.processing_class.decode(list(completion_ids), skip_special_tokens=True)

    # -- rewards and reference ------------------------------------------------------------------------------------
    def _reward_scorer(self) -> RewardScorer:
        def render(prompt, completion, processing_class):
            if is_conversational({"prompt": prompt}):
                messages = {"messages": prompt + completion}
                return apply_chat_template(messages, processing_class, **self.chat_template_kwargs)["text"]
            return prompt + completion

        return RewardScorer(self.reward_funcs, self.reward_func_names, self.reward_weights,
                            processing_classes=self.reward_processing_classes,
                            async_loop=getattr(self, "async_loop", None), render_text=render)

    # -- metrics ------------------------------------------------------------------------------------------------------
    def _log_batch(self, totals: BatchTotals, timing: BatchTiming, scored, advantages, prompts) -> None:
        m = self._metrics["train"]
        rewards_per_func = torch.tensor([s.rewards_per_func for s in scored], dtype=torch.float32)
        for i, name in enumerate(self.reward_func_names):
            m[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[:, i]).item())
            m[f"rewards/{name}/std"].append(nanstd(rewards_per_func[:, i]).item())
        rewards = torch.tensor(totals.rewards, dtype=torch.float32)
        m["reward"].append(torch.nanmean(rewards).item())
        m["reward_std"].append(nanstd(rewards).item())
        # TRL's lengths: model tokens only (tool mask 1) where there is a mask, also in num_tokens
        ids, masks = [s.rollout.completion_ids for s in scored], [s.rollout.env_mask for s in scored]
        if not self._uses_trl_generation():  # TRL's own generation already counted its tokens
            prompt_tokens = sum(len(s.rollout.prompt_ids) for s in scored)
            self.state.num_input_tokens_seen += int(prompt_tokens + sum(model_token_counts(ids, masks)))
        m["num_tokens"] = [self.state.num_input_tokens_seen]
        eos = set(self.eos_token_ids) | {self._tokenizer.pad_token_id}
        for name, value in completion_metrics(ids, masks, eos).items():
            m[name].append(value)
        wall = timing.barrier - timing.start
        rollout = timing.rollout_end - timing.start
        m["thundersync/step_wall_seconds"].append(wall)
        m["thundersync/rollout_seconds"].append(rollout)
        m["thundersync/learner_busy_seconds"].append(timing.learner_busy)
        m["thundersync/learner_tail_seconds"].append(timing.tail)
        m["thundersync/learner_idle_fraction"].append(max(0.0, 1.0 - timing.learner_busy / wall) if wall else 0.0)
        m["thundersync/stats_peak_mb"].append(totals.peak_stats_bytes / 2**20)
        m["thundersync/stats_bound_mb"].append(self._stats_bound(totals, len(scored)) / 2**20)
        if self._release() != "reward":
            m["thundersync/buffered_peak"].append(float(totals.peak_held))
        if self._release() == "turn":
            m["thundersync/turn_fallbacks"].append(float(totals.turn_fallbacks))
        m["thundersync/policy_version"].append(float(self.policy_version))
        for name, value in engine_step_metrics(self._engine).items():  # e.g. the servers' `rollout/...`
            m[name].append(value)
        for name, value in agent_metrics([s.rollout.agent for s in scored if s.rollout.agent is not None]).items():
            m[name].append(value)
        self._logs["prompt"].extend(prompts)
        self._logs["completion"].extend(s.rollout.completion for s in scored)
        for i, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        self._logs["advantages"].extend(advantages)
        self._flush_reward_logs(scored)

    def _log_extra_rows(self, column: str, rows, values: list) -> None:
        """`log_extra` of one reward call (`RewardContext`): values keyed by trajectory until `_log_batch`."""
        self._pending_extra_rows[column].update(zip(rows, values))

    def _flush_reward_logs(self, scored) -> None:
        """What reward functions logged this step, as TRL flushes it once per generation batch: `log_extra` columns
        into the completions table in row order (None on rows no call logged), `log_metric` values averaged."""
        for column in sorted(self._pending_extra_rows):
            by_row = self._pending_extra_rows[column]
            self._logs["extra"][column].extend(by_row.get(s.rollout.index) for s in scored)
        self._pending_extra_rows.clear()
        for name in sorted(self._pending_metrics):
            values = self._pending_metrics[name]
            if values:
                self._metrics["train"][name].append(sum(values) / len(values))
        self._pending_metrics.clear()

    def close(self) -> None:
        """Stop the rollout engine's worker and release the trace (also done at interpreter exit)."""
        if self._engine is not None:
            self._engine.close()
            self._engine = None
        if getattr(self, "_trace_writer", None) is not None:
            self._trace_writer.close()
            self._trace_writer = None

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        try:
            # the run's trace, held exclusively until close(): a second live run on this output_dir is refused here
            self._trace_writer = open_run_trace(self.args, self.accelerator.is_main_process, resume_from_checkpoint)
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self.close()

