"""`ThunderSyncGRPOConfig`: `trl.GRPOConfig` plus the streaming fields; refuses what cannot stream exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from trl import GRPOConfig

from ...errors import ConfigurationError, UnsupportedOptionError
from ...memory.budget import parse_budget
from ...streaming.loss_types import SUPPORTED_LOSS_TYPES, loss_type
from ...types import AgentProtocol, ReleasePoint, RewardScope, Schedule
from ..agent_config import PAPER_AGENT_FIELDS as PAPER_AGENT_FIELDS  # re-exported: moved to agent_config
from ..agent_config import AgentLoopFields, GenerationBudget
from ..config_checks import converted_config, require_choice, require_counts
from ..rollout_config import RolloutEngine, RolloutFields

SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
ROLLOUT_ENGINES: tuple[RolloutEngine, ...] = get_args(RolloutEngine)
AGENT_PROTOCOLS: tuple[AgentProtocol, ...] = get_args(AgentProtocol)


@dataclass
class ThunderSyncGRPOConfig(GRPOConfig, RolloutFields, AgentLoopFields):
    r"""
    Configuration class for [`ThunderSyncGRPOTrainer`]: `trl.GRPOConfig` plus the gradient-streaming fields.

    Every `trl.GRPOConfig` field keeps its meaning, or is refused by name (`UnsupportedOptionError`) when it cannot be
    streamed exactly (docs/exactness.md). A plain `trl.GRPOConfig` converts with [`ThunderSyncGRPOConfig.from_trl`].
    Each field's full help text is its `metadata["help"]`; with `HfArgumentParser` the fields are command-line
    arguments.

    Parameters:
        > Parameters that control when the learner works (docs/rewards.md)

        schedule (`str`, *optional*, defaults to `"thundersync"`):
            `"thundersync"` streams backward passes during the rollouts; `"sync"` waits for the whole batch.
        release (`str`, *optional*, defaults to `"content"`):
            When a trajectory's backward runs: `"content"`, `"reward"` or `"turn"`.
        max_open_groups (`int`, *optional*):
            Cap on GRPO groups holding gradient statistics at once.
        max_buffered_trajectories (`int`, *optional*):
            Cap on trajectories holding a score-gradient buffer at once (`release="content"` / `"turn"`).
        memory_budget (`str` or `int`, *optional*, defaults to `"auto"`):
            Bytes the streamed state of one learner process may take; the caps left at None are chosen from it.
        coalesce_turns (`bool`, *optional*, defaults to `True`):
            Whether, under `release="turn"`, turns of one trajectory that are ready together are learned as one pass.
        adaptive_turn_release (`bool`, *optional*, defaults to `True`):
            Whether, under `release="turn"`, a step after one whose learner bounded it runs as `release="content"`
            (busy for ≥ 3/4 of its rollout; after a content step, per-turn release resumes below 0.55).
        batch_group_members (`bool`, *optional*, defaults to `True`):
            Whether the last members of a group, ready together, are learned as one padded pass.
        batch_group_max_tokens (`int`, *optional*, defaults to `2048`):
            Most tokens one such padded pass forwards (rows × the longest row); more members run as several passes.
        shared_prefix (`bool`, *optional*, defaults to `True`):
            Whether each group's prompt is forwarded and back-propagated once instead of once per member.
        shared_prefix_min_prompt_tokens (`int`, *optional*, defaults to `256`):
            Shortest prompt (tokens) whose group shares it; a group with a shorter prompt runs full passes.

        > Parameters that control rewards (docs/rewards.md)

        reward_scope (`str`, *optional*, defaults to `"auto"`):
            How reward functions are called: per `"trajectory"`, per `"group"`, once per `"batch"`, or `"auto"`.
        grading_workers (`int`, *optional*):
            How many environments' `get_reward()` run at once.
        allow_unscorable_groups (`bool`, *optional*, defaults to `True`):
            Whether a group whose rewards are all `None` trains with zero advantage, as in TRL.

        > Parameters that control the rollout engine and servers (`RolloutFields`, docs/rollout-servers.md)

        rollout_engine, vllm_server_base_urls, vllm_weight_publisher, vllm_publish_dir, rollout_num_servers,
        rollout_vllm, rollout_vllm_kv_cache_gib, rollout_vllm_args, rollout_request_timeout, rollout_restart_timeout,
        rollout_retries, rollout_server_restarts, rollout_max_in_flight, rollout_num_threads, learner_num_threads:
            See [`RolloutFields`].

        > Parameters that control the agent loop (`AgentLoopFields`, docs/agents.md)

        agent_protocol, agent_max_turns, agent_max_tokens_per_turn, agent_max_completion_tokens,
        agent_max_context_tokens, agent_max_observation_tokens, agent_tool_timeout:
            See [`AgentLoopFields`].

        > Parameters that control logging (docs/metrics.md)

        trace (`bool`, *optional*, defaults to `True`):
            Whether to record a per-step trace in `<output_dir>/thundersync_trace/steps.jsonl`.
        peak_flops_per_s (`float`, *optional*):
            Peak FLOP/s of one trainer device; enables the trainer active MFU metric.
    """

    GENERATION_BUDGET = GenerationBudget(length_field="max_completion_length", per_turn=False)

    schedule: Schedule = field(
        default="thundersync",
        metadata={
            "help": "'thundersync' runs each trajectory's backward while the batch's rollouts still run (see release); "
            "'sync' waits until the whole batch closed (the paper's Sync baseline). Same code, same update."
        },
    )
    max_open_groups: int | None = field(
        default=None,
        metadata={
            "help": "Admission cap: at most this many GRPO groups hold gradient statistics at once, bounding their "
            "memory to 4·(2k+1)·P bytes. None = every group of the batch may be open."
        },
    )
    trace: bool = field(
        default=True,
        metadata={"help": "Record a per-step trace (rollouts, tool calls, learner items, barrier, publication) as JSON "
                  "lines in <output_dir>/thundersync_trace/steps.jsonl. A new run replaces the file, a resumed one "
                  "appends; a second run writing it at the same time is refused (TraceInUseError)."},
    )
    peak_flops_per_s: float | None = field(
        default=None,
        metadata={"help": "Peak FLOP/s of one trainer device (e.g. 989e12 for H100/H200 dense BF16); enables the "
                  "trainer active MFU metric (paper Appendix B)."},
    )
    reward_scope: RewardScope = field(
        default="auto",
        metadata={
            "help": "How reward functions are called: 'trajectory' (one completion, exact for per-sample rewards), "
            "'group' (once per GRPO group), 'batch' (trl.GRPOTrainer's one call per generation batch), or 'auto' "
            "('trajectory', checked on the first group; a function that differs stops training with RewardScopeError)."
        },
    )
    grading_workers: int | None = field(
        default=None,
        metadata={
            "help": "How many environments' get_reward() run at once, each from the moment its trajectory is "
            "delivered; user reward functions stay on one thread. None: min(2 × CPU cores, 8); 1: serial grading."
        },
    )
    release: ReleasePoint = field(
        default="content",
        metadata={
            "help": "When a trajectory's backward runs: 'content' (when its last turn ended; its score gradient waits "
            "in a P-float buffer for the reward), 'reward' (once its reward is known: the paper) or 'turn' (per "
            "agentic turn while the tool runs). Same update in every mode."
        },
    )
    shared_prefix: bool = field(
        default=True,
        metadata={
            "help": "Forward and back-propagate the prompt of each group with at least shared_prefix_min_prompt_tokens "
            "tokens once instead of once per member (paper Appendix I); the same update up to FP32 rounding. Full "
            "passes, logged with the reason, where it is not exact (sharded engines, num_iterations > 1, the "
            "off-policy mask, normalize_then_sum, gradient checkpointing, non-full attention)."
        },
    )
    shared_prefix_min_prompt_tokens: int = field(
        default=256,
        metadata={
            "help": "With shared_prefix, a group whose prompt is shorter than this many tokens runs full passes "
            "(logged per group): sharing adds a pass per group, which a short prompt does not repay. 256 rounds up "
            "the learner's break-even on the main job's model with 8 members (~192 tokens; docs/rewards.md). ≥ 1."
        },
    )
    max_buffered_trajectories: int | None = field(
        default=None,
        metadata={
            "help": "Admission cap for release='content'/'turn': at most this many trajectories hold a score-gradient "
            "buffer (or per-turn state) at once, ≤ 4·m·P extra bytes; the others are released at their reward. None "
            "= every trajectory of the batch may hold one."
        },
    )
    memory_budget: str | None = field(
        default="auto",
        metadata={
            "help": "Bytes the streamed state (group statistics, release buffers) of one learner process may take "
            "('2GB', '512MiB' or a number); the caps left at None are chosen from it. 'auto': beyond sync, open "
            "groups then release buffers up to max(25% of the planned sync bytes, 384 MiB); no buffer: "
            "release='reward'. None: no budget. See docs/memory.md."
        },
    )
    coalesce_turns: bool = field(
        default=True,
        metadata={
            "help": "release='turn': when the learner finds several turns of one trajectory ready (it was busy while "
            "their tools ran), learn them as one segment, one forward and backward instead of one per turn; the same "
            "update up to FP32 rounding. A free learner still takes each turn as it ends."
        },
    )
    adaptive_turn_release: bool = field(
        default=True,
        metadata={
            "help": "release='turn': a step after one whose learner was busy for ≥ 3/4 of its rollout runs as "
            "release='content' (one pass per trajectory at its end); after such a step, per turn again below 0.55. "
            "A turn learned as it ends costs more, which pays only where the learner would idle. Same update; "
            "logged as thundersync/turns_released."
        },
    )
    batch_group_members: bool = field(
        default=True,
        metadata={
            "help": "Learn a group's last members, ready together, as one padded pass (over its shared prefix, or as "
            "full sequences sharing their prompt) with one backward of their advantage-weighted sum; the same update "
            "up to FP32 rounding. Off with num_iterations > 1 and sharded placements."
        },
    )
    batch_group_max_tokens: int = field(
        default=2048,
        metadata={
            "help": "batch_group_members: the most tokens one padded pass forwards (members × the longest); more "
            "members run as several passes of members of similar length."
        },
    )
    allow_unscorable_groups: bool = field(
        default=True,
        metadata={
            "help": "True (TRL's behaviour): a group whose rewards are all None trains with zero advantage. False: "
            "such a group stops training with UnscorableGroupError before the optimizer step."
        },
    )

    def __post_init__(self) -> None:
        # before TRL's checks, which divide by these (num_generations=0 would be a ZeroDivisionError there)
        require_counts(self, ("per_device_train_batch_size", "gradient_accumulation_steps"))
        require_counts(self, ("num_generations",), minimum=2)
        try:
            super().__post_init__()
        except ConfigurationError:
            raise
        except ValueError as exc:  # TRL's own checks (batch sizes, generation fields): same text, typed
            raise ConfigurationError(
                f"{exc} (ThunderSync: one generation batch of per_device_train_batch_size × steps_per_generation × "
                "processes rows is one logical batch of whole GRPO groups)"
            ) from exc
        self._refuse_unstreamable()
        self._check_lengths()
        require_choice(self, "schedule", Schedule)
        require_choice(self, "reward_scope", RewardScope)
        if self.grading_workers is not None and self.grading_workers < 1:
            raise ConfigurationError(f"grading_workers={self.grading_workers} must be ≥ 1 (1 = serial grading, None = "
                                     "min(2 × CPU cores, 8))")
        require_choice(self, "release", ReleasePoint)
        if self.release == "turn" and self.gradient_checkpointing:
            raise ConfigurationError(
                "release='turn' with gradient_checkpointing=True (TRL's default): the per-turn backward keeps each "
                "turn's key/value graph for later turns, which activation checkpointing discards. Set "
                "gradient_checkpointing=False, or release='content' (one backward per trajectory, checkpointing works)")
        if self.max_buffered_trajectories is not None and self.max_buffered_trajectories < 1:
            raise ConfigurationError(
                f"max_buffered_trajectories={self.max_buffered_trajectories} must be ≥ 1 (or None for no cap)")
        try:
            parse_budget(self.memory_budget)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        if self.shared_prefix_min_prompt_tokens < 1:
            raise ConfigurationError(
                f"shared_prefix_min_prompt_tokens={self.shared_prefix_min_prompt_tokens} must be ≥ 1 (1: every group "
                "shares its prompt; to turn the shared prefix off set shared_prefix=False)")
        if self.max_open_groups is not None and self.max_open_groups < 1:
            raise ConfigurationError(f"max_open_groups={self.max_open_groups} must be ≥ 1 (or None for no cap)")
        if self.batch_group_max_tokens < 1:
            raise ConfigurationError(
                f"batch_group_max_tokens={self.batch_group_max_tokens} must be ≥ 1 (a member longer than it runs "
                "alone; to learn every member alone set batch_group_members=False)")
        self.check_agent_fields()
        self.check_rollout_fields(ROLLOUT_ENGINES)

    @classmethod
    def from_trl(cls, config: GRPOConfig) -> ThunderSyncGRPOConfig:
        """A plain `trl.GRPOConfig` as a `ThunderSyncGRPOConfig`: every field carried over, the ThunderSync fields at
        their defaults, every check and refusal applied (an unsupported option is refused by name)."""
        return converted_config(config, cls, rederived=("generation_batch_size",))

    def _check_lengths(self) -> None:
        """Token budgets: positive, or None where TRL's generation decides the length itself."""
        if self.max_completion_length is None:
            if self.rollout_engine != "trl" or loss_type(self.loss_type).bucket_scale == "completion_budget":
                raise ConfigurationError(
                    f"max_completion_length=None with rollout_engine={self.rollout_engine!r}, loss_type="
                    f"{self.loss_type!r}: ThunderSync's rollout engines, the agent loop and dr_grpo's normalizer "
                    "need a token budget per completion; set an integer ≥ 1 (None works only with "
                    "rollout_engine='trl', where TRL's generation decides, and a loss_type other than dr_grpo)")
        else:
            require_counts(self, ("max_completion_length",))
        require_counts(self, ("vllm_max_model_length",), optional=True)

    def _refuse_unstreamable(self) -> None:
        def refuse(name: str, value, why: str) -> None:
            raise UnsupportedOptionError(f"ThunderSyncGRPOConfig: {name}={value!r} is not supported: {why}")

        if self.loss_type not in SUPPORTED_LOSS_TYPES:
            refuse("loss_type", self.loss_type, f"supported loss types are {SUPPORTED_LOSS_TYPES}")
        if self.num_iterations < 1:
            refuse("num_iterations", self.num_iterations, "a generation batch is used for at least one pass; use ≥ 1")
        if self.steps_per_generation != self.gradient_accumulation_steps:
            refuse("steps_per_generation", self.steps_per_generation,
                   "each pass over a generation batch must feed exactly one optimizer step (num_iterations passes), "
                   f"so it must equal gradient_accumulation_steps={self.gradient_accumulation_steps}")
        if self.top_entropy_quantile < 1.0:
            refuse("top_entropy_quantile", self.top_entropy_quantile,
                   "TRL masks the policy term of every token whose entropy is below a quantile taken over all tokens "
                   "of its micro-batch, so no token's mask is known before the whole micro-batch has been forwarded; "
                   "it is not streamed (use 1.0)")
        if self.multi_objective_aggregation not in ("sum_then_normalize", "normalize_then_sum"):
            raise ConfigurationError(f"multi_objective_aggregation={self.multi_objective_aggregation!r} is invalid: "
                                     "must be 'sum_then_normalize' or 'normalize_then_sum' (as in trl.GRPOTrainer)")
        if self.delta is not None and self.delta < 1.0:
            refuse("delta", self.delta, "a two-sided clip below 1 cuts the on-policy gradient; use None or ≥ 1")
        vllm = self.use_vllm or self.rollout_engine == "managed_vllm"  # 'auto': checked again once it is settled
        streams = loss_type(self.loss_type).streams_vllm_correction
        if vllm and self.vllm_importance_sampling_correction and not streams:
            refuse("vllm_importance_sampling_correction", self.vllm_importance_sampling_correction,
                   f"with loss_type={self.loss_type!r} TRL folds the ratio into the loss's own weights (VESPO's gamma "
                   "weights), which is not streamed; set it to False or pick another loss_type")
        if self.use_liger_kernel:
            refuse("use_liger_kernel", self.use_liger_kernel, "the Liger GRPO loss bypasses the streamed learner")
