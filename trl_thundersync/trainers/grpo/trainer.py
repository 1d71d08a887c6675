"""`ThunderSyncGRPOTrainer`: `trl.GRPOTrainer` with zero-staleness gradient streaming.

Swap `GRPOTrainer`/`GRPOConfig` for `ThunderSyncGRPOTrainer`/`ThunderSyncGRPOConfig`; nothing else changes. The
first micro-step of every generation batch runs the whole logical batch through `streaming.pipeline`: rollouts at
θ_k, each trajectory scored and back-propagated as soon as it finishes, group statistics folded as groups close,
and at the barrier the fully normalized batch direction is written into `param.grad`. TRL's own loop then clips it
and takes the one optimizer step; a callback publishes θ_{k+1} to the rollout engine and waits for its ack.
The trainer only wires parts together; the math lives in `trl_thundersync.streaming`. The modules beside it read one
frozen `GRPOSettings` built in `__init__` and the callables handed to them, never the trainer; the barrier is one
core call (`streaming.barrier.close_grpo_batch`) through `self.collectives`; each logical batch returns an
`OpenBatch` record. With num_iterations = μ > 1, passes 2..μ over the batch run TRL's own training step on the
buffered batch (`iterations.py`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace

import torch
from accelerate.logging import get_logger
from trl import GRPOTrainer

from ...errors import UnsupportedOptionError
from ...memory.available import peak_resident_bytes
from ...memory.plan import MemoryPlan
from ...rollout.agent_setup import make_agent_engine
from ...rollout.batches import as_rollout_engine
from ...rollout.engine import RolloutEngine, TurnGenerator, engine_step_metrics
from ...rollout.trl_batch import TRLBatchEngine
from ...rollout.weights import is_peft_model
from ...streaming.barrier import close_grpo_batch
from ...streaming.grading import grading_workers
from ...streaming.learner import BatchTotals, GRPOBatchLearner
from ...streaming.learner_records import BatchTiming
from ...streaming.normalization import micro_batch_of
from ...streaming.pipeline import TurnRouter, run_logical_batch
from ...streaming.release import step_release
from ...streaming.reward_scope import RewardStage, ScopeProbe, plain_reward_functions
from ...streaming.rewards import RewardContext, ScoringInput
from ...streaming.unscorable import unscorable_warning
from ...trace.recorder import build_step_trace
from ...types import Rollout, RolloutRequest, SamplingParams
from ..lifecycle import PublishCallback, StepRecord, StreamingLifecycle, step_timing_metrics, trajectory_seed
from ..rollout_setup import RolloutTarget, build_turn_generator, check_turn_generator
from . import iterations, memory, metrics
from .backward import (
    BatchModels,
    group_backward,
    prefix_groups,
    router_aux_loss,
    trajectory_backward,
    turn_backward,
)
from .batch import OpenBatch, accelerator_collectives
from .checks import check_distributed, refuse_dropped_generation_fields, thundersync_args
from .entropy import EntropyBatch, entropy_batch, entropy_normalizers, entropy_step
from .iterations import RecordedLogProbs
from .progress import RolloutProgress
from .rewards import decode_completion, reward_scorer
from .settings import EntropySettings, GRPOSettings, objective_weights, off_policy_sampling, release_in_effect

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
        check_distributed(self.accelerator, args, self.num_generations)
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
        refuse_dropped_generation_fields(args, self._uses_trl_generation())
        self.memory_plan = self._settle_memory(args)  # caps from memory_budget, written into args; refuses a misfit
        self.settings = self._build_settings(args)  # what the helpers read, fixed for the run
        # the barrier's cross-process operations (a test may hand in a failing one)
        self.collectives = accelerator_collectives(self.accelerator, self._learner_placement)
        # MoE models (`self.aux_loss_enabled`, TRL's rule): the router load-balancing term is streamed exactly, one
        # deferred backward per TRL micro-batch (`streaming/moe_aux.py`, `backward.router_aux_loss`)
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

    def _settle_memory(self, args) -> MemoryPlan:
        """The run's memory plan (`memory.py`): logged, its caps written into `args`, a misfit refused."""
        sequence_level = self.importance_sampling_level == "sequence"
        spec = memory.memory_spec(
            self.model, args, batch_size=self._train_batch_size_local(), num_generations=self.num_generations,
            release=release_in_effect(args, self._agentic(), self.beta, sequence_level), beta=self.beta,
            peft=is_peft_model(self.model), sharded=memory.is_sharded(self.accelerator),
            replicated=memory.is_replicated(self.accelerator),
            entropy_bonus=self._entropy_bonus_enabled, router_aux=self.aux_loss_enabled,
            num_reward_functions=len(self.reward_funcs), device=self.accelerator.device,
            prompt_tokens=memory.longest_prompt(self.train_dataset, self.processing_class))
        plan, caps = memory.settle_memory(spec, args, self.accelerator.device, logger.info)
        chosen = (caps.max_open_groups, caps.max_buffered_trajectories, caps.release)
        if chosen != (spec.max_open_groups, spec.max_buffered_trajectories, spec.release):
            logger.warning("memory plan: %s (memory_budget=%r)", caps.reason, args.memory_budget)
        return plan

    def _build_settings(self, args) -> GRPOSettings:
        """The run's `GRPOSettings`, from TRL's resolved attributes (once, at the end of `__init__`)."""
        agentic, trl_generation = self._agentic(), self._uses_trl_generation()
        sequence_level = self.importance_sampling_level == "sequence"
        return GRPOSettings(
            args=args, num_processes=self.accelerator.num_processes, device=self.accelerator.device,
            beta=self.beta, epsilon_high=float(self.epsilon_high), sequence_level=sequence_level,
            mask_truncated=self.mask_truncated_completions,
            eos_and_pad=(*self.eos_token_ids, self._tokenizer.pad_token_id),
            pad_token_id=self._tokenizer.pad_token_id, pad_to_multiple_of=self.pad_to_multiple_of,
            num_generations=self.num_generations, scale_rewards=self.scale_rewards,
            release=release_in_effect(args, agentic, self.beta, sequence_level),
            uses_trl_generation=trl_generation, agentic=agentic,
            off_policy_sampling=off_policy_sampling(args, trl_generation),
            objective_weights=objective_weights(args, self.reward_weights),
            router_aux_coef=self.router_aux_loss_coef if self.aux_loss_enabled else None,
            reward_names=tuple(self.reward_func_names),
            entropy=EntropySettings.of(args, self._entropy_bonus_enabled, self.use_adaptive_entropy))

    # -- TRL hook: the learner side -----------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        if iterations.replays(self._step, self.args, self._buffered_inputs):  # passes 2..μ of num_iterations
            return self._replay_step(model, inputs, num_items_in_batch)
        started = time.perf_counter()
        model.train()
        if self._step % self.args.steps_per_generation == 0:
            batch = self._run_logical_batch(model, inputs)
            self._open_step, loss = batch.step, batch.loss
            if self.args.num_iterations > 1:  # TRL-format micro-batches (θ_k log-probs) for passes 2..μ
                models = iterations.replay_models(self._get_per_token_logps_and_entropies, self.model,
                                                       self.ref_model, self.accelerator,
                                                       self.args.gradient_checkpointing_kwargs)
                self._buffered_inputs = iterations.buffer_generation_batch(
                    self.settings, models, batch.step.items, list(batch.advantages),
                    batch.permutation, batch.recorded_logps)
        else:  # the batch direction is already handed over; later micro-steps of the window add nothing
            loss = torch.zeros((), device=self.args.device)
        self._learner_placement().end_micro_step(self.accelerator.sync_gradients)
        self._step += 1
        self._current_train_step_time += time.perf_counter() - started
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return loss

    def _replay_step(self, model, inputs, num_items_in_batch):
        """One micro-step of passes 2..μ: `trl.GRPOTrainer.training_step` itself (its `_prepare_inputs` returns the
        buffered micro-batch). TRL was built with use_vllm=False (ThunderSync's engine talks to the servers), so TRL's
        loss sees the real setting while it runs: with use_vllm=True it applies the buffered vLLM importance-sampling
        ratio. TRL's class is bound at import, not looked up as `trl.GRPOTrainer` here: scripts that rebind that name
        to the drop-in (`trl.GRPOTrainer = ThunderSyncGRPOTrainer`) would otherwise recurse into this step."""
        built_with = self.use_vllm
        self.use_vllm = self.args.samples_from_vllm()  # managed vLLM too: its samples carry vLLM log-probs
        try:
            return GRPOTrainer.training_step(self, model, inputs, num_items_in_batch)
        finally:
            self.use_vllm = built_with

    def _run_logical_batch(self, model, rows: list[dict]) -> OpenBatch:
        memory.check_trainable(self.model, self.memory_plan)  # before any rollout: the caps fit the planned model
        placement = self._learner_placement()  # first: publication and the engine's start read its full weights
        version = self.state.global_step
        if version != self.policy_version:
            self._publish(version)
        permutation = torch.randperm(len(rows)).tolist()  # TRL's shuffle-then-split, drawn at the same RNG point
        normalization = self.settings.normalization(len(rows))
        buckets = micro_batch_of(permutation, self.args.steps_per_generation) if normalization.uses_buckets else None
        prompts = self._prompts(rows)
        requests = self._requests(rows, prompts, version)
        engine = self._rollout_engine()
        # Per-source passes run on the placement's module (no DDP/engine hooks); the batch direction is handed to
        # the engine once, at the barrier (`placement/`)
        target = placement.open_batch(model)
        self._trainable = target.params
        entropy = entropy_batch(self.settings.entropy, self.entropy_coef, self._last_world_entropy, permutation,
                                self.args.steps_per_generation)  # TRL's entropy bonus (None: off)
        # adaptive turn release: after a step the learner bounded, this one runs as content release
        release = step_release(self.settings.release, self.args.adaptive_turn_release,
                               self.last_batch[1] if self.last_batch is not None else None)
        learner, recorded = self._batch_learner(self._batch_models(target), version, len(rows), normalization,
                                                buckets, permutation, entropy, release)

        def prepare(rollout: Rollout) -> ScoringInput:
            if rollout.completion is None:  # engines that return tokens only: decode exactly as TRL does
                completion = decode_completion(self._tokenizer, self.processing_class, self.tools,
                                               prompts[rollout.index], rollout.prompt_ids, rollout.completion_ids)
                rollout = replace(rollout, completion=completion)
            environments = getattr(engine, "environments", None)  # built by the engine for this batch
            return ScoringInput(rollout, prompts[rollout.index], rows[rollout.index],
                                environments[rollout.index] if environments else None)

        scorer = reward_scorer(self.reward_funcs, self.reward_func_names, self.reward_weights,
                               self.reward_processing_classes, self.chat_template_kwargs,
                               getattr(self, "async_loop", None))
        rewards = RewardStage(scorer, self.args.reward_scope, batch_size=len(rows),
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
                                               grade=rewards.start if rewards.grades_ahead else None,
                                               coalesce=self.args.coalesce_turns,
                                               batch_members=self.args.batch_group_members)
        finally:
            rewards.close()
            progress.close()
        if self.settings.release == "turn" and self.args.schedule == "thundersync":  # (sync learns no turns)
            timing = replace(timing, turns_released=release == "turn")
        self.last_batch = (totals, timing)
        ordered = sorted(scored, key=lambda s: s.rollout.index)
        warning = unscorable_warning([prepare(s.rollout) for s in ordered], ordered)
        if warning is not None:  # TRL's warning, once per generation batch (the row then gets zero advantage)
            logger.warning(warning)
        step = StepRecord(version, totals, timing, scored)
        advantages, loss = self._barrier(totals, timing, normalization, buckets, ordered, prompts, permutation,
                                         entropy)
        return OpenBatch(step, permutation, entropy, recorded, advantages, loss)

    def _batch_models(self, target) -> BatchModels:
        """What this batch's per-source passes run on; the reference models resolved now, on every process."""
        reference = turn_reference = None
        if self.beta != 0.0 and self.ref_model is not None:
            reference = self._learner_placement().reference_module(self.ref_model)
            if self.settings.release == "turn":
                turn_reference = self._learner_placement().reference_module(
                    self.accelerator.unwrap_model(self.ref_model))
        return BatchModels(target.module, target.params, self._get_per_token_logps_and_entropies, reference,
                           turn_reference, self.accelerator.autocast, self.policy_version)

    def _batch_learner(self, models: BatchModels, version: int, batch_size: int, normalization, buckets,
                       permutation: list[int],
                       entropy: EntropyBatch | None,
                       release: str) -> tuple[GRPOBatchLearner, RecordedLogProbs | None]:
        """The learner of one logical batch at `release` (this step's, `release.step_release`), with this run's
        per-source backward passes (`backward.py`), and the θ_k log-probs it records for passes 2..μ (None with one
        iteration)."""
        settings = self.settings
        entropy_coef = entropy.coef if entropy is not None else None
        prefixes = prefix_groups(settings, models, self.args.max_open_groups or batch_size // self.num_generations,
                                 self._learner_placement())
        backward = trajectory_backward(settings, models, normalization, entropy_coef, prefixes)
        recorded = None
        if self.args.num_iterations > 1:  # θ_k's log-probs for passes 2..μ, kept from the streamed forwards
            recorded = RecordedLogProbs().wrap(backward)
        turns = None
        if release == "turn":
            turns = turn_backward(settings, models, normalization, entropy_coef, prefixes)
        aux = router_aux_loss(settings, models, permutation, self.current_gradient_accumulation_steps)
        learner = GRPOBatchLearner(
            batch_size=batch_size, num_generations=self.num_generations,
            num_params=sum(p.numel() for p in models.params), policy_version=version,
            scale_rewards=self.scale_rewards, source_backward=backward,
            bucket_of=(lambda i: buckets[i]) if buckets else (lambda i: 0),
            max_open_groups=self.args.max_open_groups,
            allow_unscorable_groups=self.args.allow_unscorable_groups, device=settings.device,
            release=release, content_backward=backward.content, turn_source=turns,
            max_buffered=self.args.max_buffered_trajectories, router_aux=aux,
            entropy_micro_batch_of=entropy.micro_batch.__getitem__ if entropy is not None else None,
            off_policy_threshold=self.args.off_policy_mask_threshold, objective_weights=settings.objective_weights,
            prefixes=prefixes, group_backward=group_backward(settings, backward, self._learner_placement()),
        )
        return learner, recorded

    # -- the barrier: one core call (`streaming.barrier.close_grpo_batch`) through `self.collectives` -------------
    def _barrier(self, totals, timing, normalization, buckets, scored, prompts, permutation: list[int],
                 entropy: EntropyBatch | None) -> tuple[tuple[float, ...], torch.Tensor]:
        """The batch's advantages (TRL's, per row: passes 2..μ reuse them) and its loss value."""
        bonus = None
        if totals.entropy_terms is not None:  # TRL's entropy bonus: each micro-batch's own token normalizer
            bonus = entropy_normalizers(entropy, totals)
        label = f"optimizer step {self.state.global_step} (policy version {self.policy_version})"
        result = close_grpo_batch(totals, normalization, buckets, self.num_generations, self.collectives, label,
                                  self.settings.value_rule, bonus)
        self.last_off_policy_dropped = result.dropped
        advantages = result.advantages
        self._log_batch(totals, timing, scored, list(advantages.values), prompts, advantages.zero_std_fraction,
                        permutation)
        if bonus is not None:  # TRL's entropy metrics and the adaptive coefficient's update (TRL's own state)
            step = entropy_step(self.settings.entropy, self.args.loss_type, self.entropy_coef, bonus,
                                result.policy_terms, totals.entropy_sums, self.collectives)
            self.entropy_coef = step.coef
            if step.world_entropy is not None:
                self._last_world_entropy = step.world_entropy
            step.record(self._metrics["train"])
        if totals.router_aux is not None:  # TRL's `aux_loss`: per micro-batch, the mean over processes
            self._metrics["train"]["aux_loss"].extend(metrics.router_aux_metric(totals.router_aux.values,
                                                                                     self.collectives))
        return advantages.values, torch.tensor(result.loss, device=self.args.device)

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
        from ...envs.harness.agent_loop import ToolRunner

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
                                flops_of=self._flops_of, peak_flops_per_s=self.args.peak_flops_per_s or 0.0,
                                plan_bytes=self.memory_plan.total(self.args.schedule),
                                peak_memory_bytes=peak_resident_bytes(self.memory_plan.device))

    def _publish_due(self, global_step: int) -> bool:
        """`PublishCallback`: θ goes out after the last pass over a generation batch (`num_iterations`)."""
        return iterations.publishes_after(global_step, self.args.num_iterations)

    # -- metrics ------------------------------------------------------------------------------------------------------
    def _log_batch(self, totals: BatchTotals, timing: BatchTiming, scored, advantages, prompts,
                   zero_std_fraction: float, permutation: list[int]) -> None:
        """The batch's metrics and completions table over every process, as TRL logs them (`metrics.py`); the
        timings and the engine's counters are this process's. Flushes what the reward functions logged."""
        local = metrics.process_batch_log(self.settings, totals, scored, advantages, prompts, zero_std_fraction,
                                               metrics.stats_bound(self.settings, totals, len(scored),
                                                                        len(self.reward_funcs)), permutation,
                                               self._pending_extra_rows, self._pending_metrics)
        self._pending_extra_rows.clear()
        self._pending_metrics.clear()
        own_generation = not self.settings.uses_trl_generation
        self.state.num_input_tokens_seen = metrics.record_batch(
            local, metrics.gather_logs_of(self.accelerator),
            metrics.metric_settings(self.settings, lengths=own_generation), self._metrics["train"], self._logs,
            self.state.num_input_tokens_seen)
        m = self._metrics["train"]
        for name, value in step_timing_metrics(timing).items():
            m[name].append(value)
        m["thundersync/policy_version"].append(float(self.policy_version))
        for name, value in memory.memory_metrics(self.memory_plan, self.args.schedule).items():
            m[name].append(value)
        for name, value in engine_step_metrics(self._engine).items():  # e.g. the servers' `rollout/...`
            m[name].append(value)

    def _log_extra_rows(self, column: str, rows, values: list) -> None:
        """`log_extra` of one reward call (`RewardContext`): values keyed by trajectory until `_log_batch`."""
        self._pending_extra_rows[column].update(zip(rows, values, strict=True))
