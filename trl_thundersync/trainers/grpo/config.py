"""`ThunderSyncGRPOConfig`: `trl.GRPOConfig` plus the streaming fields; refuses what cannot stream exactly."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

from trl import GRPOConfig

from ...errors import ConfigurationError, UnsupportedOptionError
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
    GENERATION_BUDGET = GenerationBudget(length_field="max_completion_length", per_turn=False)

    schedule: Schedule = field(
        default="thundersync",
        metadata={
            "help": "'thundersync' runs each trajectory's backward as soon as its reward is known; 'sync' waits until "
            "the whole batch closed (the paper's Sync baseline). Same code, same update."
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
            "help": "How reward functions are called. 'trajectory': with one completion as soon as it ends (exact for "
            "per-sample rewards, the earliest release). 'group': once per GRPO group, when its last trajectory ends "
            "(exact for group-relative rewards: rank in the group, pairwise judges). 'batch': once with the whole "
            "generation batch, trl.GRPOTrainer's exact call (learner work waits for it). 'auto': 'trajectory', but "
            "the run's first group is also scored in one call per plain reward function, and training stops "
            "(RewardScopeError) before the first optimizer step if the values differ."
        },
    )
    grading_workers: int | None = field(
        default=None,
        metadata={
            "help": "How many environments' get_reward() run at once. Each environment's reward depends only on its "
            "own finished episode, so its grading starts the moment its trajectory is delivered, on a pool of this "
            "many threads, in every reward_scope (a group or batch call takes the values already graded); user "
            "reward functions are still called from one thread, in the same calls, after their rows' environments "
            "are graded (so a user function that reads environment state sees it after get_reward; TRL calls a sync "
            "get_reward after the user's functions). Values are identical to serial grading. 1: one trajectory at a "
            "time on the scoring thread, after the user's functions (serial, as before). None (default): min(2 × CPU "
            "cores, 8), never more than the batch's trajectories: a sandboxed test run is part CPU, part waiting "
            "(process and sandbox start-up), so two per core keep the cores busy (8 SWE gradings on 2 cores: ~5 s "
            "serial, ~3.5 s with 2 workers, ~2 s with 4), and 8 bounds the threads and concurrent sandboxes on "
            "large machines; raise it for graders that only wait (remote judges)."
        },
    )
    release: ReleasePoint = field(
        default="content",
        metadata={
            "help": "When a trajectory's backward runs under schedule='thundersync'. 'content' (default): when its "
            "last turn ended, before grading and before its group's or the batch's reward call; the score gradient "
            "waits in an FP32 buffer (P floats) until the reward binds. 'reward': once its reward is known (the "
            "paper; no buffers). 'turn': each agentic turn's action tokens while that turn's tool runs (boundary-cut "
            "backward, linear in the turns), then as 'content'. Same update in every mode."
        },
    )
    shared_prefix: bool = field(
        default=False,
        metadata={
            "help": "Forward and back-propagate each group's prompt once instead of once per member (paper Appendix "
            "I), for release='reward'/'content'; the same update up to FP32 rounding. Falls back to full passes, "
            "logged with the reason, where it is not exact (turn release, sharded engines, num_iterations > 1, the "
            "off-policy mask, normalize_then_sum, gradient checkpointing, non-full attention)."
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
    allow_unscorable_groups: bool = field(
        default=True,
        metadata={
            "help": "A row on which every reward function returned None is unscorable: as in trl.GRPOTrainer it is "
            "left out of its group's mean and std, gets zero advantage (its tokens still count in the loss "
            "normalizers) and TRL's warning is logged once per batch. True (default, TRL's behaviour): a group whose "
            "rows are all unscorable trains with zero advantage. False: such a group stops training with "
            "UnscorableGroupError before the optimizer step."
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
        if self.max_open_groups is not None and self.max_open_groups < 1:
            raise ConfigurationError(f"max_open_groups={self.max_open_groups} must be ≥ 1 (or None for no cap)")
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
