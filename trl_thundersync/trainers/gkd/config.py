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
    r"""
    Configuration class for [`ThunderSyncGKDTrainer`]: TRL's `GKDConfig` (`trl.experimental.gkd`) plus the per-turn
    streaming fields.

    Every `GKDConfig` field keeps its meaning (`lmbda`, `beta`, `temperature`, `max_new_tokens`, `seq_kd`, ...). A
    plain `GKDConfig` converts with [`ThunderSyncGKDConfig.from_trl`]; the trainer refuses a `trl.DistillationConfig`.
    Each field's full help text is its `metadata["help"]` (docs/distillation.md explains them at length).

    Parameters:
        > Parameters that control the objective

        objective (`str`, *optional*, defaults to `"gjsd"`):
            `"gjsd"`: GKD's generalized JSD with a local teacher; `"opd"`: the paper's turn-level OPD.
        on_policy_normalizer (`str`, *optional*, defaults to `"auto"`):
            What an on-policy step's summed loss is divided by: `"num_items_in_batch"` or `"scored_tokens"`.

        > Parameters that control when the learner works

        schedule (`str`, *optional*, defaults to `"thundersync"`):
            `"thundersync"` streams each turn's backward; `"sync"` waits for the whole batch.
        turn_backward (`str`, *optional*, defaults to `"auto"`):
            How a turn's backward reaches its context: `"boundary_cut"` (linear) or `"naive"` (quadratic).
        max_open_trajectories (`int`, *optional*):
            Cap on trajectories holding per-turn backward state at once.

        > Parameters that control the teacher

        teacher_server_url (`str`, *optional*):
            A vLLM-compatible teacher server, in place of `teacher_model`.
        teacher_vocab_map (`str`, *optional*):
            A JSON map from student to teacher token ids, for a teacher with another vocabulary.
        teacher_scoring (`str`, *optional*, defaults to `"turn"`):
            When the teacher scores: per `"turn"` or per `"trajectory"`.
        teacher_server_model (`str`, *optional*):
            Model name sent to the teacher server.
        teacher_server_timeout (`float`, *optional*, defaults to `120.0`):
            Seconds one teacher request may take.
        teacher_server_retries (`int`, *optional*, defaults to `3`):
            Times a teacher request is resent after no answer or HTTP 500/502/503.

        > Parameters that control the rollout engine and servers (`RolloutFields`, `TRLVLLMServerFields`)

        rollout_engine, vllm_server_base_urls, vllm_weight_publisher, vllm_publish_dir, rollout_num_servers,
        rollout_vllm, rollout_vllm_kv_cache_gib, rollout_vllm_args, rollout_request_timeout, rollout_restart_timeout,
        rollout_retries, rollout_server_restarts, rollout_max_in_flight, rollout_num_threads, learner_num_threads:
            See [`RolloutFields`].
        use_vllm, vllm_mode, vllm_server_base_url, vllm_server_host, vllm_server_port, vllm_server_timeout,
        vllm_group_port, vllm_gpu_memory_utilization, vllm_max_model_length:
            `trl.GRPOConfig`'s fields of the same names, with their defaults and help.

        > Parameters that control the agent loop (`AgentLoopFields`)

        agent_protocol (`str`, *optional*, defaults to `"paper"`):
            What an episode with tools is; GKD keeps the paper's protocol (GRPO's default is `"trl"`).
        max_tool_calling_iterations (`int`, *optional*):
            `agent_protocol="trl"`: rounds of tool execution per episode (TRL's GRPO field).
        agent_max_turns, agent_max_tokens_per_turn, agent_max_completion_tokens, agent_max_context_tokens,
        agent_max_observation_tokens, agent_tool_timeout:
            See [`AgentLoopFields`].

        > Parameters that control logging

        trace (`bool`, *optional*, defaults to `True`):
            Whether to record a per-step trace in `<output_dir>/thundersync_trace/steps.jsonl`.
        peak_flops_per_s (`float`, *optional*):
            Peak FLOP/s of one trainer device; enables the trainer active MFU metric.
    """

    GENERATION_BUDGET = GenerationBudget(length_field="max_new_tokens", per_turn=True)

    objective: Objective = field(
        default="gjsd",
        metadata={"help": "'gjsd': GKD's generalized Jensen-Shannon divergence with `beta` over the full vocabulary "
                  "(a local teacher), as trl's GKDTrainer; 'opd': the paper's turn-level on-policy distillation, "
                  "sampled-token advantage sg(log π_T − log π_θ)."},
    )
    on_policy_normalizer: OnPolicyNormalizerSetting = field(
        default="auto",
        metadata={"help": "What an on-policy step's summed loss is divided by: 'num_items_in_batch' (stock "
                  "GKDTrainer's count of the dataset rows' label tokens: a swapped script trains as before) or "
                  "'scored_tokens' (the completion tokens scored: DistillationTrainer and the paper). 'auto': the "
                  "first for objective='gjsd', the second for 'opd'."},
    )
    schedule: Schedule = field(
        default="thundersync",
        metadata={"help": "'thundersync' runs each turn's student backward as soon as the teacher scored it, while "
                  "tools and other turns still run; 'sync' waits until the batch closed (same code, same update)."},
    )
    turn_backward: TurnBackwardSetting = field(
        default="auto",
        metadata={"help": "'boundary_cut': each turn forwards only its new tokens, context adjoints replayed when the "
                  "trajectory closes (linear cost); 'naive': each turn re-runs its context (quadratic, works with "
                  "activation checkpointing). 'auto': boundary_cut, or naive with gradient_checkpointing."},
    )
    max_open_trajectories: int | None = field(
        default=None,
        metadata={"help": "Admission cap: at most this many trajectories hold per-turn backward state at once; the "
                  "others' turns wait, scored, in arrival order. Same update. None: no cap."},
    )
    teacher_server_url: str | None = field(
        default=None,
        metadata={"help": "Base URL of a vLLM-compatible teacher server (e.g. http://host:8000) that returns prompt "
                  "log-probabilities from /v1/completions; replaces teacher_model, needs objective='opd' and lmbda=1. "
                  "The server must use the student's tokenizer."},
    )
    teacher_vocab_map: str | None = field(
        default=None,
        metadata={"help": "Path to a JSON list: the teacher token id of every student token id, for a teacher whose "
                  "vocabulary is ordered differently or larger. None: teacher and student share one vocabulary."},
    )
    teacher_scoring: TeacherScoring = field(
        default="turn",
        metadata={"help": "When the teacher scores: 'turn' (each action as soon as it is complete: earliest release, "
                  "prefill quadratic in the turns) or 'trajectory' (one request per finished trajectory: linear "
                  "prefill, later release). Same scores, same update."},
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
    peak_flops_per_s: float | None = field(
        default=None,
        metadata={"help": "Peak FLOP/s of one trainer device (e.g. 989e12 for H100/H200 dense BF16); enables the "
                  "trainer active MFU metric (paper Appendix B)."},
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
