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

import time
from collections import defaultdict
from dataclasses import replace

import torch
from accelerate.logging import get_logger
from trl import GRPOTrainer

from ..errors import UnsupportedOptionError
from ..rollout.agent_setup import make_agent_engine
from ..rollout.batches import as_rollout_engine
from ..rollout.engine import RolloutEngine, TurnGenerator, engine_step_metrics
from ..rollout.trl_batch import TRLBatchEngine
from ..streaming.advantages import Advantages, batch_advantages, statistics_rewards
from ..streaming.barrier import grpo_barrier
from ..streaming.batch_metrics import stats_bound_bytes
from ..streaming.grading import grading_workers
from ..streaming.learner import BatchTotals, GRPOBatchLearner
from ..streaming.learner_records import BatchTiming
from ..streaming.normalization import micro_batch_of
from ..streaming.pipeline import TurnRouter, run_logical_batch
from ..streaming.reward_scope import RewardStage, ScopeProbe, plain_reward_functions
from ..streaming.rewards import RewardContext, ScoringInput
from ..streaming.unscorable import unscorable_warning
from ..trace.recorder import build_step_trace
from ..types import Rollout, RolloutRequest, SamplingParams
from . import grpo_iterations, grpo_metrics
from .grpo_backward import router_aux_loss, trajectory_backward, turn_backward
from .grpo_checks import check_distributed, refuse_dropped_generation_fields, thundersync_args
from .grpo_entropy import entropy_batch, entropy_normalizers, entropy_step
from .grpo_progress import RolloutProgress
from .grpo_rewards import decode_completion, reward_scorer
from .grpo_settings import loss_normalization, policy_value_rule
from .lifecycle import PublishCallback, StepRecord, StreamingLifecycle, step_timing_metrics, trajectory_seed
from .rollout_setup import RolloutTarget, build_turn_generator, check_turn_generator

__all__ = ["ThunderSyncGRPOTrainer", "trajectory_seed"]  # trajectory_seed: re-exported from `lifecycle`

logger = get_logger(__name__)


class ThunderSyncGRPOTrainer(StreamingLifecycle, GRPOTrainer):
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
        args = thundersync_args(model, args)
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
        # 'auto' becomes one engine, decided with the model in hand (logged): managed vLLM where it can serve it
        args.settle_rollout_engine(self.model.config, uses_rollout_func=rollout_func is not None)
        check_distributed(self)
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
        refuse_dropped_generation_fields(self)
        # MoE models (`self.aux_loss_enabled`, TRL's rule): the router load-balancing term is streamed exactly, one
        # deferred backward per TRL micro-batch (`streaming/moe_aux.py`, `grpo_backward.router_aux_loss`)
        self.policy_version = 0
        self._engine: RolloutEngine | None = None
        self._turns = TurnRouter(required=False)  # agent turns → the open batch's learner (release="turn")
        self._open_step: StepRecord | None = None  # the streamed batch awaiting its step's trace (`lifecycle.py`)
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.last_batch: tuple[BatchTotals, BatchTiming] | None = None
        self.last_trace = None  # StepTrace of the latest optimizer step
        self.last_off_policy_dropped: tuple[int, ...] = ()  # rows TRL's off-policy mask dropped in the last batch
        self._pending_extra_rows: defaultdict[str, dict] = defaultdict(dict)  # log_extra: column → {trajectory: value}
        self._scope_probe = ScopeProbe(plain_reward_functions(self.reward_funcs, num_user_rewards))  # once per run
        self._environment_rewards = tuple(range(num_user_rewards, len(self.reward_funcs)))  # TRL's get_reward wrappers
        self.add_callback(PublishCallback(self))

    # -- TRL hook: the learner side -----------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        if grpo_iterations.replays(self):  # passes 2..μ of num_iterations: TRL's own step on the buffered batch
            return grpo_iterations.replay_step(self, model, inputs, num_items_in_batch)
        started = time.perf_counter()
        model.train()
        if self._step % self.args.steps_per_generation == 0:
            loss = self._run_logical_batch(model, inputs)
            if self.args.num_iterations > 1:  # TRL-format micro-batches (θ_k log-probs) for passes 2..μ
                grpo_iterations.buffer_generation_batch(self, self._open_step.items, self._last_advantages,
                                                        self._permutation, self._recorded_logps)
        else:  # the batch direction is already handed over; later micro-steps of the window add nothing
            loss = torch.zeros((), device=self.args.device)
        self._learner_placement().end_micro_step(self.accelerator.sync_gradients)
        self._step += 1
        self._current_train_step_time += time.perf_counter() - started
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return loss

    def _run_logical_batch(self, model, rows: list[dict]) -> torch.Tensor:
        placement = self._learner_placement()  # first: publication and the engine's start read its full weights
        version = self.state.global_step
        if version != self.policy_version:
            self._publish(version)
        permutation = torch.randperm(len(rows)).tolist()  # TRL's shuffle-then-split, drawn at the same RNG point
        self._permutation = permutation  # TRL's micro-batches, reused by passes 2..μ (num_iterations > 1)
        normalization = loss_normalization(self.args, len(rows), self.accelerator.num_processes)
        buckets = micro_batch_of(permutation, self.args.steps_per_generation) if normalization.uses_buckets else None
        prompts = self._prompts(rows)
        requests = self._requests(rows, prompts, version)
        engine = self._rollout_engine()
        # Per-source passes run on the placement's module (no DDP/engine hooks); the batch direction is handed to
        # the engine once, at the barrier (`placement/`)
        target = placement.open_batch(model)
        module, self._trainable = target.module, target.params
        learner = self._batch_learner(module, version, len(rows), normalization, buckets, permutation)

        def prepare(rollout: Rollout) -> ScoringInput:
            if rollout.completion is None:  # engines that return tokens only: decode exactly as TRL does
                completion = decode_completion(self, prompts[rollout.index], rollout.prompt_ids, rollout.completion_ids)
                rollout = replace(rollout, completion=completion)
            environments = getattr(engine, "environments", None)  # built by the engine for this batch
            return ScoringInput(rollout, prompts[rollout.index], rows[rollout.index],
                                environments[rollout.index] if environments else None)

        rewards = RewardStage(reward_scorer(self), self.args.reward_scope, batch_size=len(rows),
                              num_generations=self.num_generations, prepare=prepare, probe=self._scope_probe,
                              context=RewardContext(self.state, self._log_extra_rows, self._log_metric),
                              environment_rewards=self._environment_rewards,
                              grading_workers=grading_workers(self.args.grading_workers, len(rows)))
        scored = []
        progress = RolloutProgress(len(rows), version, disable=self.args.disable_tqdm
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
        self._open_step = StepRecord(version, totals, timing, scored)
        ordered = sorted(scored, key=lambda s: s.rollout.index)
        warning = unscorable_warning([prepare(s.rollout) for s in ordered], ordered)
        if warning is not None:  # TRL's warning, once per generation batch (the row then gets zero advantage)
            logger.warning(warning)
        return self._barrier(totals, timing, normalization, buckets, ordered, prompts)

    def _batch_learner(self, module, version: int, batch_size: int, normalization, buckets,
                       permutation: list[int]) -> GRPOBatchLearner:
        """The learner of one logical batch, with this run's per-source backward passes (`grpo_backward`)."""
        self._entropy_batch = entropy = entropy_batch(self, permutation)  # TRL's entropy bonus (None: off)
        entropy_coef = entropy.coef if entropy is not None else None
        backward = trajectory_backward(self, module, normalization, entropy_coef)
        if self.args.num_iterations > 1:  # θ_k's log-probs for passes 2..μ, kept from the streamed forwards
            self._recorded_logps = grpo_iterations.RecordedLogProbs().wrap(backward)
        return GRPOBatchLearner(
            batch_size=batch_size, num_generations=self.num_generations,
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

    def _objective_weights(self) -> tuple[float, ...] | None:
        """normalize_then_sum: the reward weights its per-function group statistics use (None: sum_then_normalize)."""
        if self.args.multi_objective_aggregation != "normalize_then_sum":
            return None
        return tuple(float(w) for w in self.reward_weights.tolist())

    def _release(self) -> str:
        """The release point in effect: 'turn' needs turn events, which only multi-turn agent engines emit."""
        if self.args.release == "turn" and not self._agentic():
            return "content"
        if self.args.release == "turn" and self.beta != 0.0 and self.args.use_bias_correction_kl and \
                self.importance_sampling_level == "sequence":
            return "content"  # the sequence-level KL ratio spreads the whole row's KL over its tokens: not per turn
        return self.args.release

    def _stats_bound(self, totals, batch_size: int) -> int:
        """The memory bound of this batch's streamed statistics (`batch_metrics.stats_bound_bytes`)."""
        return stats_bound_bytes(
            totals, batch_size=batch_size, num_generations=self.num_generations,
            max_open_groups=self.args.max_open_groups, release=self._release(), beta=self.beta,
            max_buffered=self.args.max_buffered_trajectories, micro_batches=self.args.steps_per_generation,
            num_reward_functions=len(self.reward_funcs),
            off_policy_mask=self.args.off_policy_mask_threshold is not None)

    # -- the barrier: collectives, the non-finite check and param.grad here; the math in `streaming.barrier` ------
    def _barrier(self, totals, timing, normalization, buckets, scored, prompts) -> torch.Tensor:
        device = self.accelerator.device
        global_tokens = int(self.accelerator.reduce(torch.tensor(sum(totals.scored_tokens), device=device),
                                                    reduction="sum").item())
        if totals.objective_rewards is None:
            values, policy_scale, zero_std = self._advantages(totals)
            advantages = Advantages(tuple(values), policy_scale, 0.0, zero_std)
        else:
            advantages = self._batch_advantages(totals)
        bonus = None
        if totals.entropy_terms is not None:  # TRL's entropy bonus: each micro-batch's own token normalizer
            bonus = entropy_normalizers(self._entropy_batch, totals)
        result = grpo_barrier(totals, advantages, normalization, global_tokens, buckets, policy_value_rule(self.args),
                              bonus)
        self._last_advantages = list(result.advantages.values)  # TRL's per-row advantages (passes 2..μ)
        self.last_off_policy_dropped = result.dropped
        self._learner_placement().hand_over(
            result.direction, f"optimizer step {self.state.global_step} (policy version {self.policy_version})")
        self._log_batch(totals, timing, scored, self._last_advantages, prompts, result.advantages.zero_std_fraction)
        if bonus is not None:  # TRL's entropy metrics and the adaptive coefficient's update
            entropy_step(self, bonus, result.policy_terms, totals.entropy_sums)
        if totals.router_aux is not None:
            self._log_router_aux(totals.router_aux.values)
        return torch.tensor(result.loss, device=self.args.device)

    def _batch_advantages(self, totals: BatchTotals) -> Advantages:
        """TRL's advantages (`streaming.advantages`), with the values of the batch statistics gathered from every
        process."""
        local = statistics_rewards(totals)
        gathered = None if local is None else self.accelerator.gather(local.to(self.accelerator.device)).cpu()
        return batch_advantages(totals, gathered, self.num_generations)

    def _advantages(self, totals: BatchTotals) -> tuple[list[float], float, float]:
        """sum_then_normalize: (A_i, the barrier's policy scale, `frac_reward_zero_std`) of `_batch_advantages`."""
        advantages = self._batch_advantages(totals)
        return list(advantages.values), advantages.policy_scale, advantages.zero_std_fraction

    def _log_router_aux(self, values) -> None:
        """TRL's `aux_loss` metric: one entry per micro-batch, each the mean over processes of that micro-batch's."""
        local = torch.tensor(values, dtype=torch.float32, device=self.accelerator.device)
        gathered = self.accelerator.gather(local).view(-1, len(values)).mean(dim=0)
        self._metrics["train"]["aux_loss"].extend(gathered.tolist())

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

    def use_turn_generator(self, generator: TurnGenerator) -> RolloutEngine:
        """Sample with `generator` (any `TurnGenerator`: `submit`, `publish`, `policy_version`, `close`; lifecycle in
        `rollout/engine.py`) instead of the engine the config's rollout fields would build. Call it before `train()`,
        with the generator serving the trainer's `policy_version`. With `tools` / `environment_factory` the agent loop
        drives it one request per turn, else one request per trajectory; the engine built around it is returned. The
        trainer owns the generator from then on (publishes to it, closes it). Not with `rollout_func` or
        `rollout_engine='trl'`, which generate with TRL's own batch generation."""
        check_turn_generator(self._uses_trl_generation(), built=self._engine is not None)
        self._turn_generator = generator
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
        target = RolloutTarget(self._policy_module(), self._tokenizer, self.accelerator.device,
                               self.accelerator.num_processes, self.policy_version, self.accelerator.process_index)
        generator = build_turn_generator(target, self.args, sampling,
                                         on_metric=lambda name, value: self._metrics["train"][name].append(value))
        return self.use_turn_generator(generator)

    def _agent_engine(self, generator: TurnGenerator):
        """The agent loop over `generator`, rendering prompts with TRL's own template choice (`self.chat_template`,
        from the tools TRL collected: `make_agent_engine` applies the same rule to the same tools)."""
        from ..envs.harness.agent_loop import ToolRunner

        return make_agent_engine(
            generator, processing_class=self.processing_class, tokenizer=self._tokenizer,
            limits=self.args.agent_limits(), tools=self._standalone_tools or (),
            environment_factory=self.environment_factories, chat_template_kwargs=self.chat_template_kwargs,
            has_tools=bool(self.tools), tool_runner=ToolRunner(loop=getattr(self, "async_loop", None)),
            on_turn=self._turns, max_concurrent=max(8, self._train_batch_size_local()),
            policy=self._policy_module())

    def _train_batch_size_local(self) -> int:
        return self.args.per_device_train_batch_size * self.args.steps_per_generation

    def _sampling_params(self) -> SamplingParams:
        a = self.args
        return SamplingParams(
            max_new_tokens=a.max_completion_length, temperature=a.temperature, top_p=a.top_p,
            top_k=a.top_k or 0, min_p=a.min_p or 0.0, repetition_penalty=a.repetition_penalty,
            eos_token_ids=tuple(self.eos_token_ids), pad_token_id=self._tokenizer.pad_token_id,
        )

    # -- lifecycle hooks (`lifecycle.StreamingLifecycle` owns publication, the trace, close and train) ----------
    def _step_trace(self, step: StepRecord, optimizer_end: float, publish_end: float):
        return build_step_trace(step=step.version, schedule=self.args.schedule, timing=step.timing,
                                work=step.totals.work, rollouts=step.items, optimizer_end=optimizer_end,
                                publish_end=publish_end, stats_bytes=step.totals.peak_stats_bytes,
                                flops_of=self._flops_of, peak_flops_per_s=self.args.peak_flops_per_s or 0.0)

    def _publish_due(self, global_step: int) -> bool:
        """`PublishCallback`: θ goes out after the last pass over a generation batch (`num_iterations`)."""
        return grpo_iterations.publishes_after(global_step, self.args.num_iterations)

    # -- metrics ------------------------------------------------------------------------------------------------------
    def _log_batch(self, totals: BatchTotals, timing: BatchTiming, scored, advantages, prompts,
                   zero_std_fraction: float) -> None:
        """The batch's metrics and completions table over every process, as TRL logs them (`grpo_metrics`); the
        timings and the engine's counters are this process's."""
        local = grpo_metrics.process_batch_log(self, totals, scored, advantages, prompts, zero_std_fraction,
                                               self._stats_bound(totals, len(scored)))
        grpo_metrics.record_batch(self, local, grpo_metrics.gather_logs_of(self.accelerator))
        m = self._metrics["train"]
        for name, value in step_timing_metrics(timing).items():
            m[name].append(value)
        m["thundersync/policy_version"].append(float(self.policy_version))
        for name, value in engine_step_metrics(self._engine).items():  # e.g. the servers' `rollout/...`
            m[name].append(value)

    def _log_extra_rows(self, column: str, rows, values: list) -> None:
        """`log_extra` of one reward call (`RewardContext`): values keyed by trajectory until `_log_batch`."""
        self._pending_extra_rows[column].update(zip(rows, values, strict=True))
