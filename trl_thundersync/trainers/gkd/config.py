"""`ThunderSyncGKDConfig`: TRL's `GKDConfig` plus the per-turn streaming fields; refuses what cannot stream exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from trl.experimental.gkd import GKDConfig

from ...distill.normalizer import NormalizerName
from ...distill.teacher_schedule import TeacherScoring
from ...errors import ConfigurationError, UnsupportedOptionError
from ...rollout.vllm_api import check_base_url
from ...types import AgentProtocol, Schedule, TurnBackward
from ..agent_config import PAPER_AGENT_FIELDS as PAPER_AGENT_FIELDS  # re-exported: moved to agent_config
from ..agent_config import AgentLoopFields, GenerationBudget, agent_protocol_field
from ..config_checks import converted_config, require_choice, require_counts
from ..rollout_config import RolloutEngine, RolloutFields, TRLVLLMServerFields

Objective = Literal["gjsd", "opd"]
OnPolicyNormalizerSetting = Literal["auto", NormalizerName]  # "auto" is resolved in __post_init__
TurnBackwardSetting = Literal["auto", TurnBackward]  # "auto" is resolved in __post_init__
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
TURN_BACKWARDS: tuple[TurnBackwardSetting, ...] = get_args(TurnBackwardSetting)
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
# TRL's own batch generation ("trl") is GRPO's; distillation streams turns from ThunderSync's engines
ROLLOUT_ENGINES: tuple[RolloutEngine, ...] = tuple(e for e in get_args(RolloutEngine) if e != "trl")
AGENT_PROTOCOLS: tuple[AgentProtocol, ...] = get_args(AgentProtocol)


@dataclass
class ThunderSyncGKDConfig(GKDConfig, RolloutFields, TRLVLLMServerFields, AgentLoopFields):
    GENERATION_BUDGET = GenerationBudget(length_field="max_new_tokens", per_turn=True)

    objective: Objective = field(
        default="gjsd",
        metadata={"help": "'gjsd': GKD's generalized Jensen-Shannon divergence with `beta` over the full vocabulary "
                  "(a local teacher model), as trl's GKDTrainer; 'opd': the paper's turn-level on-policy distillation, "
                  "sampled-token advantage sg(log π_T − log π_θ). What an on-policy step is divided by: "
                  "on_policy_normalizer."},
    )
    on_policy_normalizer: OnPolicyNormalizerSetting = field(
        default="auto",
        metadata={"help": "What an on-policy step's summed loss is divided by. 'num_items_in_batch': the count "
                  "transformers' Trainer hands training_step — the label tokens of the DATASET rows of the "
                  "accumulation window (over processes with average_tokens_across_devices) — which stock trl "
                  "GKDTrainer divides the generated completions' loss by (a bug TRL acknowledges, "
                  "huggingface/trl #6452 and #6478); a swapped GKD script trains exactly as before. "
                  "'scored_tokens': the completion tokens actually scored (trl's DistillationTrainer, and the "
                  "paper's Eq. 9). 'auto': 'num_items_in_batch' for objective='gjsd', 'scored_tokens' for "
                  "objective='opd'. On several processes the scale follows: 'num_items_in_batch' keeps stock GKD's "
                  "(each process divides by its count, DDP averages: 1/num_processes of the one-process step), "
                  "'scored_tokens' gives the one-process step, TRL's off-policy steps included (as "
                  "DistillationTrainer's fix, #6478). Off-policy steps are TRL's own code either way."},
    )
    schedule: Schedule = field(
        default="thundersync",
        metadata={"help": "'thundersync' runs each turn's student backward as soon as the teacher scored it, while "
                  "tools and other turns still run; 'sync' waits until the batch closed (same code, same update)."},
    )
    turn_backward: TurnBackwardSetting = field(
        default="auto",
        metadata={"help": "'boundary_cut': each turn forwards only its new tokens over detached key/value proxies and "
                  "the deferred context adjoints are replayed when the trajectory closes (linear cost); 'naive': "
                  "every turn re-runs its whole context (quadratic; the reference, and what works with activation "
                  "checkpointing); 'auto': boundary_cut, or naive when gradient_checkpointing is on."},
    )
    max_open_trajectories: int | None = field(
        default=None,
        metadata={"help": "Admission cap: at most this many trajectories hold per-turn backward state at once (the "
                  "boundary-cut key/value graphs and deferred context adjoints, which grow with each trajectory's "
                  "length); turns of the others wait, scored, and are processed in arrival order when one closes. "
                  "Same update. None: every trajectory of the batch may be open."},
    )
    teacher_server_url: str | None = field(
        default=None,
        metadata={"help": "Base URL of a vLLM-compatible teacher server (e.g. http://host:8000) that returns prompt "
                  "log-probabilities from /v1/completions; replaces teacher_model, needs objective='opd' and lmbda=1. "
                  "The server must use the student's tokenizer."},
    )
    teacher_vocab_map: str | None = field(
        default=None,
        metadata={"help": "Path to a JSON list of V_s integers: the teacher token id of every student token id, for a "
                  "teacher whose vocabulary is ordered differently or larger (validated: total over the student's "
                  "vocab_size, in the teacher's range). The teacher reads and scores the mapped ids (OPD), and a "
                  "local teacher's logits are gathered at the mapped ids (generalized JSD). None: teacher and student "
                  "must share one vocabulary and tokenizer."},
    )
    teacher_scoring: TeacherScoring = field(
        default="turn",
        metadata={"help": "When the teacher scores: 'turn' sends each turn's context + action the moment the action "
                  "is complete, so its student backward can run while the next tool runs (earliest release; the "
                  "teacher prefills Σ_j |context_j + action_j|, quadratic in the turns, since prompt log-probs are "
                  "never served from vLLM's prefix cache); 'trajectory' scores all turns of a trajectory with one "
                  "request over its full sequence once it finished (linear prefill; the turns' backwards wait for "
                  "the trajectory's end). Same scores, same update. The step metrics thundersync/"
                  "teacher_prefill_tokens_{turn,trajectory}_schedule give both costs for the same turns."},
    )
    teacher_server_model: str | None = field(
        default=None, metadata={"help": "Model name sent to the teacher server (None: the first of /v1/models)."}
    )
    teacher_server_timeout: float = field(
        default=120.0, metadata={"help": "Seconds one teacher-server request may take before it is an error."}
    )
    teacher_server_retries: int = field(
        default=3,
        metadata={"help": "Times one teacher-server request is sent again after no answer or HTTP 500/502/503, on "
                  "TRL's client's schedule (at once, then after 4, 8, ... s); a timeout is not resent."},
    )
    agent_protocol: AgentProtocol = agent_protocol_field("paper")  # agent_config: why it differs from GRPO's
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={"help": "agent_protocol='trl': rounds of tool execution per episode (TRL's field; None: no cap, 0: "
                  "no tool runs)."},
    )
    trace: bool = field(
        default=True,
        metadata={"help": "Record a per-step trace (rollouts, turns, tools, teacher scoring, learner items, barrier, "
                  "publication) in <output_dir>/thundersync_trace/steps.jsonl. A new run replaces the file, a resumed "
                  "one appends; a second run writing it at the same time is refused (TraceInUseError)."},
    )

    def __post_init__(self) -> None:
        require_counts(self, ("per_device_train_batch_size", "gradient_accumulation_steps", "max_new_tokens"))
        require_counts(self, ("max_length",), optional=True)  # SFT's truncation length; None: no truncation
        try:
            super().__post_init__()
        except ConfigurationError:
            raise
        except ValueError as exc:  # TRL's own checks (lmbda, beta ranges): same text, typed
            raise ConfigurationError(str(exc)) from exc
        require_choice(self, "objective", Objective)
        require_choice(self, "schedule", Schedule)
        require_choice(self, "on_policy_normalizer", OnPolicyNormalizerSetting)
        require_choice(self, "turn_backward", TurnBackwardSetting)
        require_choice(self, "teacher_scoring", TeacherScoring)
        self.check_rollout_fields(ROLLOUT_ENGINES)
        if self.max_open_trajectories is not None and self.max_open_trajectories < 1:
            raise ConfigurationError(f"max_open_trajectories={self.max_open_trajectories} must be ≥ 1 (or None for "
                                     "no cap)")
        self.check_agent_fields()
        if self.agent_protocol == "paper" and self.max_tool_calling_iterations is not None:
            # GKD has this field for agent_protocol='trl' only (GRPO's is TRL's own, a default for agent_max_turns)
            raise ConfigurationError(f"max_tool_calling_iterations={self.max_tool_calling_iterations} applies to "
                                     "agent_protocol='trl'; with 'paper' use agent_max_turns")
        self._refuse_unstreamable()

    @classmethod
    def from_trl(cls, config: GKDConfig) -> ThunderSyncGKDConfig:
        """A plain `trl.experimental.gkd.GKDConfig` as a `ThunderSyncGKDConfig`: every field carried over, the
        ThunderSync fields at their defaults, every check and refusal applied (an unsupported option by name)."""
        return converted_config(config, cls)

    def _refuse_unstreamable(self) -> None:
        def refuse(name: str, value, why: str) -> None:
            raise UnsupportedOptionError(f"ThunderSyncGKDConfig: {name}={value!r} is not supported: {why}")

        normalizer = self.on_policy_normalizer
        if normalizer == "auto":
            normalizer = "num_items_in_batch" if self.objective == "gjsd" else "scored_tokens"
        if self.gradient_accumulation_steps > 1 and self.lmbda < 1.0 and normalizer != "num_items_in_batch":
            # TRL draws on/off-policy per micro-step and divides every micro-batch's loss by the window's
            # num_items_in_batch, so each micro-step stands alone only under that normalizer; a scored-token count
            # over the window's on-policy micro-steps would be known only after the off-policy ones ran.
            refuse("gradient_accumulation_steps", self.gradient_accumulation_steps,
                   f"with lmbda={self.lmbda} TRL's GKD draws on- or off-policy per micro-step and divides each "
                   "micro-batch by the window's num_items_in_batch; with on_policy_normalizer="
                   f"{normalizer!r} the window's on-policy micro-steps would be divided by another count. Use "
                   "on_policy_normalizer='num_items_in_batch' (stock GKD's), gradient_accumulation_steps=1, or "
                   "lmbda=1.0")
        if self.turn_backward == "boundary_cut" and self.gradient_checkpointing:
            refuse("gradient_checkpointing", self.gradient_checkpointing,
                   "the boundary-cut backward keeps each turn's key/value graph, which activation checkpointing drops; "
                   "set gradient_checkpointing=False, or turn_backward='naive'")
        if self.teacher_vocab_map is not None and (self.lmbda != 1.0 or self.seq_kd):
            refuse("lmbda" if self.lmbda != 1.0 else "seq_kd", self.lmbda if self.lmbda != 1.0 else self.seq_kd,
                   "with teacher_vocab_map, off-policy steps would run TRL's generalized JSD (or teacher generation) "
                   "on unmapped teacher logits; use lmbda=1.0 and seq_kd=False")
        if self.teacher_server_url is not None:
            check_base_url(self.teacher_server_url, "teacher_server_url")
            if self.objective != "opd":
                refuse("objective", self.objective, "a teacher server returns sampled-token log-probabilities only; "
                       "the generalized JSD needs the full distribution of a local teacher_model. Use objective='opd'")
            if self.lmbda != 1.0 or self.seq_kd:
                refuse("lmbda" if self.lmbda != 1.0 else "seq_kd", self.lmbda if self.lmbda != 1.0 else self.seq_kd,
                       "off-policy steps use TRL's generalized JSD with a local teacher; with a teacher server use "
                       "lmbda=1.0 and seq_kd=False")
            if self.teacher_server_timeout <= 0:
                raise ConfigurationError(f"teacher_server_timeout={self.teacher_server_timeout} must be > 0")
            if self.teacher_server_retries < 0:
                raise ConfigurationError(f"teacher_server_retries={self.teacher_server_retries} must be ≥ 0")
        if self.turn_backward == "auto":
            self.turn_backward = "naive" if self.gradient_checkpointing else "boundary_cut"
        if self.on_policy_normalizer == "auto":
            self.on_policy_normalizer = "num_items_in_batch" if self.objective == "gjsd" else "scored_tokens"
        if self.use_liger_kernel:
            refuse("use_liger_kernel", self.use_liger_kernel, "the Liger loss bypasses the streamed learner")
