"""`ThunderSyncGKDTrainer`: `trl.experimental.gkd.GKDTrainer` with on-policy distillation streamed per turn.

Swap `GKDTrainer`/`GKDConfig` for `ThunderSyncGKDTrainer`/`ThunderSyncGKDConfig`. Every micro-step draws
`random() <= lmbda` exactly as TRL does. On-policy steps run the logical batch through `distill.pipeline`: the
embedded engine samples at θ_k (multi-turn with tools/environments), the frozen teacher scores each turn as soon as
its action is complete, the student's backward for that turn runs at once (boundary-cut by default), and at the
barrier Σ_j g_j / N_k is written into `param.grad` (N_k: stock GKDTrainer's `num_items_in_batch` for the
generalized JSD, the scored tokens for OPD — `on_policy_normalizer`, `distill.normalizer`); TRL's loop clips it and
takes the one optimizer step, and a callback publishes θ_{k+1} and waits for the acknowledgement. Off-policy steps
(dataset sequences, or `seq_kd` teacher generations) are TRL's own code path.
The math lives in `trl_thundersync.distill`.

Several processes (DDP): each process streams its own micro-batches (rows seeded by their global row), the barrier
exchanges every process's share once (`distill.processes`: the global scored-token count N_k, failures, the batch
metrics) and hands world · Σ_r g_j / N_k to the placement, whose mean over processes is the one-process direction.
Rank 0 alone publishes to shared rollout servers (`rollout/publish_role.py`); a served teacher is read-only.
"""

from __future__ import annotations

import dataclasses
import logging
import random

import torch
from accelerate.utils import broadcast, gather_object
from trl.experimental.gkd import GKDConfig, GKDTrainer
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.sft_trainer import SFTTrainer

from ...distill.learner import DistillBatchLearner
from ...distill.losses import generalized_jsd_per_token, opd_loss_sum
from ...distill.normalizer import StepNormalizer, step_loss, step_normalizer
from ...distill.pipeline import TurnRouter, run_distill_batch
from ...distill.processes import (
    RankShare,
    batch_metrics,
    check_shares,
    failed_share,
    finished_share,
    local_share,
)
from ...distill.records import DistillTotals, TeacherScores, TrajectoryClosed
from ...distill.teacher import LocalTeacher
from ...distill.turn_backward import BoundaryCutBackward, GradientSum, NaiveTurnBackward
from ...distill.vocab_map import VocabularyMap
from ...envs.harness.metrics import model_token_counts
from ...errors import TeacherScoringError, UnsupportedOptionError
from ...rollout.batches import as_rollout_engine
from ...rollout.engine import RolloutEngine, TurnGenerator, engine_step_metrics
from ...streaming.learner_records import BatchTiming
from ...trace.recorder import build_step_trace
from ..lifecycle import PublishCallback, StepRecord, StreamingLifecycle, step_timing_metrics
from ..placement import check_engine
from ..rollout_setup import RolloutTarget, build_turn_generator, check_turn_generator
from .checks import check_vocabularies, refuse_combinations
from .config import ThunderSyncGKDConfig
from .rollout import (
    agent_engine,
    global_first_row,
    pass_through_collator,
    requests_from_collated,
    requests_from_rows,
    sampling_params,
)

logger = logging.getLogger(__name__)


class ThunderSyncGKDTrainer(StreamingLifecycle, GKDTrainer):
    """Drop-in for `trl.experimental.gkd.GKDTrainer` (same constructor, plus `tools` / `environment_factory`).

    The rollout side is pluggable: `use_turn_generator(generator)` (before `train()`) samples the on-policy turns
    with any `TurnGenerator` instead of the engine the config's rollout fields would build; `rollout_engine` is the
    engine the trainer samples with.
    """

    _tag_names = ["trl", "gkd", "thundersync"]

    def __init__(self, model=None, teacher_model=None, args=None, data_collator=None, train_dataset=None,
                 eval_dataset=None, processing_class=None, compute_metrics=None, callbacks=None,
                 optimizers=(None, None), preprocess_logits_for_metrics=None, peft_config=None, formatting_func=None,
                 tools=None, environment_factory=None):
        self._agentic = bool(tools) or environment_factory is not None
        if isinstance(args, GKDConfig) and not isinstance(args, ThunderSyncGKDConfig):  # accepted by TRL: convert
            args = ThunderSyncGKDConfig.from_trl(args)
        refuse_combinations(args, teacher_model, eval_dataset, self._agentic)
        if processing_class is None and isinstance(model, str):
            from transformers import AutoTokenizer

            processing_class = AutoTokenizer.from_pretrained(model)
        if self._agentic and data_collator is None:
            data_collator = pass_through_collator
        trainer_kwargs = dict(args=args, data_collator=data_collator, train_dataset=train_dataset,
                              eval_dataset=eval_dataset, processing_class=processing_class,
                              compute_metrics=compute_metrics, callbacks=callbacks, optimizers=optimizers,
                              preprocess_logits_for_metrics=preprocess_logits_for_metrics, peft_config=peft_config,
                              formatting_func=formatting_func)
        if teacher_model is not None and args.teacher_vocab_map is None:
            check_vocabularies(model, teacher_model, processing_class)
            super().__init__(model=model, teacher_model=teacher_model, **trainer_kwargs)
            self._teacher = LocalTeacher(self.teacher_model, self.accelerator.device)
        else:  # TRL's GKDTrainer refuses a teacher with another vocab_size, so a mapped teacher is attached here
            self._init_without_trl_teacher(model, trainer_kwargs)
            self._teacher = self._mapped_local_teacher(teacher_model) if teacher_model is not None else \
                self._server_teacher()
        check_engine(self.accelerator, self.args)  # the training engines the learner placement covers
        self.args.settle_rollout_engine(self.model.config)  # 'auto': managed vLLM where it can serve the model
        if self._agentic:
            from trl.chat_template_utils import add_response_schema

            tok = self.processing_class
            if getattr(tok, "response_template", None) is None and getattr(tok, "response_schema", None) is None:
                self.processing_class = add_response_schema(tok)
        self.tools, self.environment_factory = list(tools or []), environment_factory
        self.policy_version = 0
        self._engine = None
        self._router = TurnRouter()
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        self._micro_step = 0  # the next micro-step's place in its accumulation window
        self._seeded_by: float | None = None  # the count this batch's turn losses are divided by (None: none)
        self._open_step: StepRecord | None = None  # the streamed batch awaiting its step's trace (`lifecycle.py`)
        self._window: list = []  # on-policy micro-batches of the current optimizer step, not yet streamed
        self.last_batch: tuple[DistillTotals, BatchTiming] | None = None
        self.last_trace = None
        self.add_callback(PublishCallback(self))

    def _init_without_trl_teacher(self, model, trainer_kwargs: dict) -> None:
        """GKDTrainer's construction without its teacher: the same SFT setup (raw `messages` kept for the ChatML
        collator), dropout off, and the fields `training_step` reads (on-policy only: lmbda=1, no seq_kd)."""
        from trl.experimental.utils import DataCollatorForChatML
        from trl.trainer.utils import disable_dropout_in_model

        args = trainer_kwargs["args"]
        args.remove_unused_columns = False
        args.dataset_kwargs = {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}
        if trainer_kwargs["data_collator"] is None:
            trainer_kwargs["data_collator"] = DataCollatorForChatML(tokenizer=trainer_kwargs["processing_class"],
                                                                    max_length=args.max_length)
        SFTTrainer.__init__(self, model, **trainer_kwargs)
        if args.disable_dropout:
            disable_dropout_in_model(self.model)
        self.teacher_model = None
        self.lmbda, self.beta, self.temperature, self.seq_kd = 1.0, args.beta, args.temperature, False
        self.generation_config = self.model.generation_config

    def _server_teacher(self):
        from ...distill.teacher_server import ServerTeacher

        a = self.args
        return ServerTeacher(a.teacher_server_url, a.teacher_server_model, a.teacher_server_timeout,
                             vocab_map=self._vocab_map(teacher_vocab=None), tokenizer=self.processing_class,
                             retries=a.teacher_server_retries)

    def _mapped_local_teacher(self, teacher_model) -> LocalTeacher:
        """A local teacher with another vocabulary, read through `teacher_vocab_map` (a model or a path, loaded with
        `teacher_model_init_kwargs` as TRL would)."""
        from transformers import AutoModelForCausalLM

        if isinstance(teacher_model, str):
            kwargs = {"trust_remote_code": self.args.trust_remote_code, **(self.args.teacher_model_init_kwargs or {})}
            teacher_model = AutoModelForCausalLM.from_pretrained(teacher_model, **kwargs)
        elif self.args.teacher_model_init_kwargs is not None:
            raise UnsupportedOptionError("teacher_model_init_kwargs is set but teacher_model is already instantiated")
        self.teacher_model = self.accelerator.prepare_model(teacher_model, evaluation_mode=True)
        teacher_vocab = self.teacher_model.config.get_text_config().vocab_size
        return LocalTeacher(self.teacher_model, self.accelerator.device, vocab_map=self._vocab_map(teacher_vocab))

    def _vocab_map(self, teacher_vocab: int | None) -> VocabularyMap | None:
        """`args.teacher_vocab_map`, validated against the student's vocab_size (and the teacher's, when known)."""
        if self.args.teacher_vocab_map is None:
            return None
        student_vocab = self.accelerator.unwrap_model(self.model).config.get_text_config().vocab_size
        return VocabularyMap.from_json(self.args.teacher_vocab_map, student_vocab=student_vocab,
                                       teacher_vocab=teacher_vocab)

    # -- TRL hooks --------------------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's off-policy loss; under `on_policy_normalizer="scored_tokens"` scaled by the number of processes when
        it is normalized by the global token count.

        transformers gathers `num_items_in_batch` over the processes (`average_tokens_across_devices`), and
        `GKDTrainer.compute_loss` divides each process's JSD sum by it; DDP then averages the gradients, which leaves
        1/num_processes of the one-process step. `Trainer.compute_loss` multiplies by num_processes for exactly this
        (TRL's DistillationTrainer divides the count instead, in the fix of #6478); GKDTrainer's override skips it.
        Under the default `"num_items_in_batch"` (stock GKD's normalization) that is kept, so a swapped script
        trains as before on any number of processes; under `"scored_tokens"` (DistillationTrainer's) an off-policy
        step equals the one-process step on the same global batch, as its streamed on-policy steps do."""
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        world = self.accelerator.num_processes
        if self.args.on_policy_normalizer != "scored_tokens":
            return loss
        if world > 1 and num_items_in_batch is not None and self.args.average_tokens_across_devices:
            loss = (loss[0] * world, *loss[1:]) if return_outputs else loss * world
        return loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        micro, final = self._micro_step, self.accelerator.sync_gradients  # this micro-step's place in its window
        self._micro_step = 0 if final else micro + 1
        if self._draw_on_policy():
            model.train()  # as transformers' training_step, which stock GKD's on-policy step reaches (and logs by)
            if self._mixed_windows():
                return self._mixed_on_policy_micro_step(model, inputs, num_items_in_batch, micro, final)
            return self._on_policy_micro_step(model, inputs, num_items_in_batch)
        if self.seq_kd:
            with unwrap_model_for_generation(self.teacher_model, self.accelerator,
                                             generation_kwargs=self.generation_kwargs) as teacher:
                ids, attention, labels = self.generate_on_policy_outputs(teacher, inputs, self.generation_config)
            inputs["input_ids"], inputs["attention_mask"], inputs["labels"] = ids, attention, labels
        self._learner_placement().note_engine_step()  # TRL's step moves θ: a sharded engine's replica is stale
        return SFTTrainer.training_step(self, model, inputs, num_items_in_batch)

    # -- the streamed on-policy batch -------------------------------------------------------------------------------
    def _on_policy_micro_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """Collect the micro-batches of one optimizer step (lmbda=1 whenever gradient_accumulation_steps > 1, so
        every micro-step of the window lands here) and stream them as one logical batch at the window's last one;
        the earlier micro-steps add nothing to param.grad and report a zero loss. `num_items_in_batch` is the
        window's count (transformers hands every micro-step of a window the same one): stock GKDTrainer's
        normalizer (`distill.normalizer`)."""
        self._window.append(inputs)
        if len(self._window) < self.current_gradient_accumulation_steps:
            loss = torch.zeros((), device=self.args.device)
        else:
            micro_batches, self._window = self._window, []
            count = float(num_items_in_batch) if num_items_in_batch is not None else None
            loss = self._streamed_batch(model, micro_batches, count)
        self._learner_placement().end_micro_step(self.accelerator.sync_gradients)
        return loss

    def _mixed_windows(self) -> bool:
        """lmbda < 1 with gradient accumulation: TRL draws per micro-step, so a window mixes on- and off-policy
        micro-steps, each divided by the window's num_items_in_batch (so each stands alone: config check)."""
        return self.lmbda < 1.0 and self.args.gradient_accumulation_steps > 1

    def _mixed_on_policy_micro_step(self, model, inputs, num_items_in_batch, micro: int, final: bool) -> torch.Tensor:
        """One on-policy micro-step of a mixed window, streamed at once as its own batch (sampled at θ_k, like every
        micro-step of the window) and added to what TRL's off-policy micro-steps put in `param.grad`: stock
        GKDTrainer's step, as each micro-batch's loss is divided by the window's count, not its own. A micro-batch
        whose completions are all empty adds nothing, as in stock TRL."""
        count = float(num_items_in_batch) if num_items_in_batch is not None else None
        loss = self._streamed_batch(model, [inputs], count, first_micro_step=micro, final=final)
        self._learner_placement().end_micro_step(final)
        return loss

    def _draw_on_policy(self) -> bool:
        """TRL's draw `random() <= lmbda`, at the same point of the RNG stream on every process. With several
        processes the main process's draw decides for all (every process seeds alike, so they agree anyway): an
        on-policy step on one process and an off-policy one on another would pair different collectives."""
        on_policy = random.random() <= self.lmbda
        if self.accelerator.num_processes > 1 and 0.0 < self.lmbda < 1.0:
            flag = torch.tensor([float(on_policy)], device=self.accelerator.device)
            on_policy = bool(broadcast(flag, from_process=0).item())
        return on_policy

    def _streamed_batch(self, model, micro_batches: list, num_items: float | None = None, *,
                        first_micro_step: int = 0, final: bool | None = None) -> torch.Tensor:
        """Stream this process's share of the logical batch, exchange the shares (`distill.processes`: every process
        enters, also after a failure or with zero tokens), then hand factor · Σ_r g_j / N_k to the placement, N_k
        being the config's `on_policy_normalizer` (`distill.normalizer`). `final` (mixed windows only): the share
        joins `param.grad` (`ReplicatedPlacement.add_share`) instead of replacing it; `first_micro_step` is the first
        micro-batch's place in its window (its rows' seeds)."""
        placement = self._learner_placement()  # first: publication and the engine's start read its full weights
        version = self.state.global_step
        if version != self.policy_version:
            self._publish(version)
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        label = f"optimizer step {self.state.global_step + 1} (policy version {version})"
        error, share = None, None
        try:
            share = self._stream_share(placement, model, micro_batches, version, num_items, first_micro_step)
        except TeacherScoringError as exc:  # which step's batch the teacher failed (its text names the turn)
            error = TeacherScoringError(f"{label}: {exc}; the optimizer step is refused")
            error.__cause__ = exc
        except Exception as exc:  # re-raised after the exchange, which the other processes are waiting in
            error = exc
        if error is not None:
            if world == 1:
                raise error
            share = failed_share(rank, error)
        shares = gather_object([share]) if world > 1 else [share]
        check_shares(shares, rank, error)
        shared_count = world > 1 and self.args.average_tokens_across_devices
        normalizers = [step_normalizer(self.args.on_policy_normalizer, shares, r, label=label,
                                       allow_empty=final is not None) for r in range(world)]
        self._report_normalizer(normalizers[rank])
        direction = local_share(self.last_batch[0].grads, normalizers[rank].share_scale(self._seeded_by))
        if final is None:
            placement.hand_over(direction, label)
        else:
            placement.add_share(direction, label, final=final)
        for name, value in batch_metrics(shares, self.args.objective).items():
            self._metrics["train"][name].append(value)
        self._metrics["train"]["thundersync/normalizer_tokens"].append(
            normalizers[rank].tokens if shared_count or world == 1 else sum(n.tokens for n in normalizers))
        self._metrics["train"]["thundersync/policy_version"].append(float(self.policy_version))
        loss = step_loss(shares, lambda r: normalizers[r])
        return torch.tensor(loss, device=self.args.device)  # the same on every process

    def _report_normalizer(self, normalizer: StepNormalizer) -> None:
        """Say once per run (and again when it changes) what on-policy steps are divided by."""
        said = (normalizer.name, normalizer.fallback)
        if getattr(self, "_normalizer_said", None) == said:
            return
        self._normalizer_said = said
        if normalizer.fallback is not None:
            logger.warning("on_policy_normalizer='num_items_in_batch': %s", normalizer.fallback)
        logger.info("ThunderSyncGKDTrainer: on-policy steps are normalized by %s", normalizer.describe())

    def _stream_share(self, placement, model, micro_batches: list, version: int, num_items: float | None = None,
                      first_micro_step: int = 0) -> RankShare:
        """This process's micro-batches as one streamed batch: rows indexed locally, seeded by their global row."""
        to_requests = requests_from_rows if self._agentic else requests_from_collated
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        # stock GKD's count is known before the batch: each turn's loss is divided by it before its backward
        self._seeded_by = num_items if self.args.on_policy_normalizer == "num_items_in_batch" and num_items else None
        requests = []
        for m, inputs in enumerate(micro_batches, start=first_micro_step):  # global row r: the same seed however
            rows = len(inputs) if self._agentic else inputs["prompts"].shape[0]  # the batch was split
            requests.extend(to_requests(inputs, self.args.seed, version, first_index=len(requests),
                                        first_row=global_first_row(m, rows, rank, world)))
        engine = self._rollout_engine()
        target = placement.open_batch(model)  # the module and parameters the per-turn passes differentiate
        if isinstance(self._teacher, LocalTeacher) and self.teacher_model is not None:
            # the teacher as the engine holds it, locally (ZeRO-3 / FSDP2: an unsharded copy, gathered once)
            self._teacher.model = placement.reference_module(self.teacher_model)
        module, self._trainable = target.module, target.params
        module.train()
        grads = GradientSum(self._trainable)
        backward_cls = BoundaryCutBackward if self.args.turn_backward == "boundary_cut" else NaiveTurnBackward
        backward = backward_cls(module, self._trainable, self._objective, grads, self.accelerator.device)
        learner = DistillBatchLearner(batch_size=len(requests), policy_version=version, backward=backward, grads=grads,
                                      max_open_trajectories=self.args.max_open_trajectories)
        items: list = []
        vocab = module.config.get_text_config().vocab_size if self.args.objective == "gjsd" else None
        totals, timing = run_distill_batch(engine, requests, version, self._teacher, learner,
                                           schedule=self.args.schedule, teacher_scoring=self.args.teacher_scoring,
                                           router=self._router if self._agentic else None,
                                           logits_vocab_size=vocab, on_item=items.append)
        self.last_batch = (totals, timing)
        self._open_step = StepRecord(version, totals, timing, items)
        if self._seeded_by is not None:  # the share carries the plain loss sum (metrics, the normalizer's loss)
            totals = dataclasses.replace(totals, loss_sum=totals.loss_sum * self._seeded_by)
        rollouts = [i.rollout for i in items if hasattr(i, "rollout")]
        return finished_share(rank, totals, step_timing_metrics(timing),
                              model_token_counts([r.completion_ids for r in rollouts], [r.env_mask for r in rollouts]),
                              [r.agent for r in rollouts if r.agent is not None], engine_step_metrics(self._engine),
                              teacher_wait=timing.teacher_wait, teacher=timing.teacher,
                              num_items=num_items)

    def _objective(self, logits: torch.Tensor, actions: torch.Tensor, teacher: TeacherScores) -> torch.Tensor:
        """One turn's summed loss, divided by stock GKD's `num_items_in_batch` when that is the normalizer (known
        before the batch: the backward is seeded with 1/N as stock TRL's is), else undivided (N_k at the barrier)."""
        if self.args.objective == "opd":
            loss = opd_loss_sum(logits, actions, teacher.logprobs)
        else:  # TRL's compute_loss calls generalized_jsd_loss at its default temperature 1.0 (sampling: temperature)
            loss = generalized_jsd_per_token(logits, teacher.logits.to(logits.device), self.beta).sum()
        return loss if self._seeded_by is None else loss / self._seeded_by

    def use_turn_generator(self, generator: TurnGenerator) -> RolloutEngine:
        """Sample the on-policy rollouts with `generator` (any `TurnGenerator`: `submit`, `publish`,
        `policy_version`, `close`; lifecycle in `rollout/engine.py`) instead of the engine the config's rollout fields
        would build. Call it before `train()`, with the generator serving the trainer's `policy_version`. With `tools`
        / `environment_factory` the agent loop drives it one request per turn, else one request per prompt; the
        engine built around it is returned. The trainer owns the generator from then on (publishes to it, closes
        it)."""
        check_turn_generator(False, built=self._engine is not None)
        self._turn_generator = generator
        self._engine = as_rollout_engine(generator)  # closed by close() even if the agent loop cannot be built
        if self._agentic:
            self._engine = agent_engine(generator, self.args, tokenizer=self.processing_class, tools=self.tools,
                                        environment_factory=self.environment_factory, on_turn=self._router,
                                        policy=self._policy_module())
        return self._engine

    def _rollout_engine(self) -> RolloutEngine:
        if self._engine is None:
            eos = self.generation_config.eos_token_id
            eos = [eos] if isinstance(eos, int) else list(eos or [])
            per_turn = self.args.agent_limits().max_tokens_per_turn if self._agentic else self.args.max_new_tokens
            sampling = sampling_params(self.args, eos, self.processing_class.pad_token_id, per_turn)
            target = RolloutTarget(self._policy_module(), self.processing_class, self.accelerator.device,
                                   self.accelerator.num_processes, self.policy_version, self.accelerator.process_index)
            generator = build_turn_generator(target, self.args, sampling,
                                             on_metric=lambda name, value: self._metrics["train"][name].append(value))
            self.use_turn_generator(generator)
        return self._engine

    # -- publication, trace and metrics (called by PublishCallback after each optimizer step) -----------------------
    def _publish_due(self, global_step: int) -> bool:
        """`PublishCallback`: every optimizer step ends a generation batch here (`lifecycle.StreamingLifecycle`
        publishes, traces, closes and trains)."""
        return True

    def _step_trace(self, step: StepRecord, optimizer_end: float, publish_end: float):
        rollouts = [item.rollout for item in step.items if isinstance(item, TrajectoryClosed)]
        return build_step_trace(step=step.version, schedule=self.args.schedule, timing=step.timing,
                                work=step.totals.work, rollouts=rollouts, optimizer_end=optimizer_end,
                                publish_end=publish_end, flops_of=self._flops_of,
                                peak_flops_per_s=self.args.peak_flops_per_s or 0.0)

    def close(self) -> None:
        """Stop the rollout engine, release the trace and close the teacher (also done at interpreter exit)."""
        super().close()
        self._teacher.close()
