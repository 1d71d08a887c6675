"""`ThunderSyncGKDConfig`: TRL's `GKDConfig` plus the per-turn streaming fields; refuses what cannot stream exactly."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from trl.experimental.gkd import GKDConfig

from ..errors import ConfigurationError, UnsupportedOptionError
from ..rollout.vllm_api import check_base_url
from .config_checks import converted_config, require_counts
from .rollout_config import RolloutFields, TRLVLLMServerFields

OBJECTIVES = ("gjsd", "opd")
TURN_BACKWARDS = ("auto", "boundary_cut", "naive")
SCHEDULES = ("thundersync", "sync")
ROLLOUT_ENGINES = ("auto", "local_process", "local_thread", "embedded_server", "vllm_server")
AGENT_PROTOCOLS = ("paper", "trl")
PAPER_AGENT_FIELDS = ("agent_max_turns", "agent_max_tokens_per_turn", "agent_max_completion_tokens",
                      "agent_max_context_tokens", "agent_max_observation_tokens")


@dataclass
class ThunderSyncGKDConfig(GKDConfig, RolloutFields, TRLVLLMServerFields):
    objective: str = field(
        default="gjsd",
        metadata={"help": "'gjsd': GKD's generalized Jensen-Shannon divergence with `beta` over the full vocabulary "
                  "(a local teacher model), as trl's GKDTrainer; 'opd': the paper's turn-level on-policy distillation, "
                  "sampled-token advantage sg(log π_T − log π_θ). Both are "
                  "normalized by the batch's scored-token count."},
    )
    schedule: str = field(
        default="thundersync",
        metadata={"help": "'thundersync' runs each turn's student backward as soon as the teacher scored it, while "
                  "tools and other turns still run; 'sync' waits until the batch closed (same code, same update)."},
    )
    turn_backward: str = field(
        default="auto",
        metadata={"help": "'boundary_cut': each turn forwards only its new tokens over detached key/value proxies and "
                  "the deferred context adjoints are replayed when the trajectory closes (linear cost); 'naive': "
                  "every turn re-runs its whole context (quadratic; the reference, and what works with activation checkpointing); "
                  "'auto': boundary_cut, or naive when gradient_checkpointing is on."},
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
    teacher_server_model: str | None = field(
        default=None, metadata={"help": "Model name sent to the teacher server (None: the first of /v1/models)."}
    )
    teacher_server_timeout: float = field(
        default=120.0, metadata={"help": "Seconds one teacher-server request may take before it is an error."}
    )
    agent_protocol: str = field(
        default="paper",
        metadata={"help": "What an episode is with tools / environment_factory. 'paper' (default here): the paper's "
                  "turn-level OPD protocol (one tool call per turn, an unparsable call answered with a parser-error "
                  "observation, the agent_max_* budgets). 'trl': TRL 1.16's tool loop as in GRPO and "
                  "trl.DistillationTrainer (every call of a turn runs, the episode ends at a turn without a parsed "
                  "call or after max_tool_calling_iterations rounds, max_new_tokens bounds the whole multi-turn "
                  "completion including tool tokens). TRL's GKDTrainer has no tool loop, so neither is a drop-in "
                  "default; 'paper' keeps the published OPD workloads reproducible."},
    )
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={"help": "agent_protocol='trl': rounds of tool execution per episode (TRL's field; None: no cap, 0: "
                  "no tool runs)."},
    )
    agent_max_turns: int = field(default=8, metadata={"help": "Agent loop (tools/environments): turns per trajectory."})
    agent_max_tokens_per_turn: int | None = field(
        default=None, metadata={"help": "Agent loop: generated tokens per turn. None: max_new_tokens."}
    )
    agent_max_completion_tokens: int | None = field(
        default=None,
        metadata={"help": "Agent loop: model tokens per trajectory over all turns. None: agent_max_turns × max_new_tokens."},
    )
    agent_max_context_tokens: int = field(default=8192, metadata={"help": "Agent loop: prompt + everything appended."})
    agent_max_observation_tokens: int = field(
        default=256, metadata={"help": "Agent loop: tool-result tokens kept per observation (head and tail)."}
    )
    agent_tool_timeout: float = field(default=60.0, metadata={"help": "Agent loop: seconds per tool call."})
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
        for name, value, allowed in (("objective", self.objective, OBJECTIVES), ("schedule", self.schedule, SCHEDULES),
                                     ("turn_backward", self.turn_backward, TURN_BACKWARDS)):
            if value not in allowed:
                raise ConfigurationError(f"{name}={value!r} is not one of {allowed}")
        self.check_rollout_fields(ROLLOUT_ENGINES)
        if self.max_open_trajectories is not None and self.max_open_trajectories < 1:
            raise ConfigurationError(f"max_open_trajectories={self.max_open_trajectories} must be ≥ 1 (or None for "
                                     "no cap)")
        require_counts(self, ("agent_max_turns", "agent_max_context_tokens"))
        require_counts(self, ("agent_max_tokens_per_turn", "agent_max_completion_tokens"), optional=True)
        if self.agent_max_observation_tokens < 2 or self.agent_tool_timeout <= 0:
            raise ConfigurationError(
                f"agent_max_observation_tokens={self.agent_max_observation_tokens} must be ≥ 2 and agent_tool_timeout="
                f"{self.agent_tool_timeout} must be > 0"
            )
        self._check_agent_protocol()
        self._refuse_unstreamable()

    @classmethod
    def from_trl(cls, config: GKDConfig) -> "ThunderSyncGKDConfig":
        """A plain `trl.experimental.gkd.GKDConfig` as a `ThunderSyncGKDConfig`: every field carried over, the
        ThunderSync fields at their defaults, every check and refusal applied (an unsupported option by name)."""
        return converted_config(config, cls)

    def _check_agent_protocol(self) -> None:
        if self.agent_protocol not in AGENT_PROTOCOLS:
            raise ConfigurationError(f"agent_protocol={self.agent_protocol!r} is not one of {AGENT_PROTOCOLS}")
        require_counts(self, ("max_tool_calling_iterations",), minimum=0, optional=True)
        if self.agent_protocol == "trl":
            defaults = {f.name: f.default for f in fields(self)}
            for name in PAPER_AGENT_FIELDS:
                if getattr(self, name) != defaults[name]:
                    raise ConfigurationError(
                        f"{name}={getattr(self, name)!r} is a budget of agent_protocol='paper'; with "
                        "agent_protocol='trl' an episode is bounded by max_tool_calling_iterations and max_new_tokens "
                        "(the whole multi-turn completion). Set agent_protocol='paper' to use it")
        elif self.max_tool_calling_iterations is not None:
            raise ConfigurationError(f"max_tool_calling_iterations={self.max_tool_calling_iterations} applies to "
                                     "agent_protocol='trl'; with 'paper' use agent_max_turns")

    def _refuse_unstreamable(self) -> None:
        def refuse(name: str, value, why: str) -> None:
            raise UnsupportedOptionError(f"ThunderSyncGKDConfig: {name}={value!r} is not supported: {why}")

        if self.gradient_accumulation_steps > 1 and self.lmbda < 1.0:
            # TRL draws on/off-policy per micro-step and scales each micro-batch's loss by a token count of the
            # dataset labels, so an optimizer step is not one batch of sampled trajectories normalized once.
            refuse("gradient_accumulation_steps", self.gradient_accumulation_steps,
                   f"with lmbda={self.lmbda} TRL's GKD draws on- or off-policy per micro-step, "
                   "so one optimizer step would mix streamed and dataset micro-batches with TRL's per-micro-batch "
                   "normalization; use gradient_accumulation_steps=1 (raise per_device_train_batch_size), or "
                   "lmbda=1.0, where the per_device_train_batch_size × gradient_accumulation_steps "
                   "rows of a step are streamed as one logical batch")
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
        if self.turn_backward == "auto":
            self.turn_backward = "naive" if self.gradient_checkpointing else "boundary_cut"
        if self.use_liger_kernel:
            refuse("use_liger_kernel", self.use_liger_kernel, "the Liger loss bypasses the streamed learner")

    def agent_limits(self):
        """The agent loop's budgets, defaulting to the GKD generation fields (TRL's loop: max_new_tokens in all)."""
        from ..envs.harness.agent_loop import AgentLimits
        from ..envs.harness.trl_tool_loop import TRLLoopLimits

        if self.agent_protocol == "trl":
            return TRLLoopLimits(max_completion_length=self.max_new_tokens,
                                 max_tool_calling_iterations=self.max_tool_calling_iterations,
                                 tool_timeout_s=self.agent_tool_timeout)

        per_turn = self.agent_max_tokens_per_turn or self.max_new_tokens
        return AgentLimits(
            max_turns=self.agent_max_turns,
            max_tokens_per_turn=per_turn,
            max_completion_tokens=self.agent_max_completion_tokens or self.agent_max_turns * per_turn,
            max_context_tokens=self.agent_max_context_tokens,
            max_observation_tokens=self.agent_max_observation_tokens,
            tool_timeout_s=self.agent_tool_timeout,
        )
