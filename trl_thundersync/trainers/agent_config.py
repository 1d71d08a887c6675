"""Agent-loop fields shared by `ThunderSyncGRPOConfig` and `ThunderSyncGKDConfig`: what an episode with tools /
`environment_factory` is (`agent_protocol`) and the paper protocol's budgets. One definition, one validation, one
rule for the budgets left at None, for both trainers.

`AgentLoopFields` is a dataclass mixin, like `rollout_config.RolloutFields`; a config sets `GENERATION_BUDGET` (the
TRL field that bounds its generation and how the paper protocol reads it), calls `check_agent_fields()` from its
`__post_init__` and gets `agent_limits()`. The one default the trainers do not share is `agent_protocol` itself
(`agent_protocol_field(default)`): GRPO replaces `trl.GRPOTrainer`, whose tool loop is `"trl"`; GKD replaces TRL's
`GKDTrainer`, which has no tool loop, and keeps `"paper"`, on which the turn-level OPD objective and its published
workloads are defined. The config must also have `max_tool_calling_iterations` (TRL's GRPO field; GKD adds it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ..errors import ConfigurationError
from ..types import AgentProtocol
from .config_checks import require_choice, require_counts

if TYPE_CHECKING:
    from ..envs.harness.agent_loop import AgentLimits
    from ..envs.harness.trl_tool_loop import TRLLoopLimits

PAPER_AGENT_FIELDS = ("agent_max_turns", "agent_max_tokens_per_turn", "agent_max_completion_tokens",
                      "agent_max_context_tokens", "agent_max_observation_tokens")
# The paper protocol's budgets where the field and TRL's fields leave them open.
DEFAULT_MAX_TURNS = 8
DEFAULT_MAX_CONTEXT_TOKENS = 8192
DEFAULT_MAX_OBSERVATION_TOKENS = 256

_AGENT_PROTOCOL_HELP = (
    "What an episode with tools / environment_factory is. 'trl' (GRPO's default): TRL 1.16's tool loop, as in "
    "trl.GRPOTrainer. 'paper' (GKD's default): the ThunderSync paper's protocol, one tool call per turn, with the "
    "agent_max_* budgets."
)


def agent_protocol_field(default: AgentProtocol):
    """The `agent_protocol` field with a trainer's default (keyword-only, like the rest of the mixin)."""
    return field(default=default, kw_only=True, metadata={"help": _AGENT_PROTOCOL_HELP})


@dataclass(frozen=True)
class GenerationBudget:
    """The TRL field of a config that bounds generation, as the agent loop reads it."""

    length_field: str  # "max_completion_length" (GRPO) or "max_new_tokens" (GKD)
    per_turn: bool  # paper protocol: False = it bounds the whole trajectory (TRL's GRPO completion), True = one
    # generate call (TRL's GKD), so a trajectory's default budget is agent_max_turns × the per-turn budget


@dataclass(kw_only=True)  # keyword-only: positional arguments stay TRL's (output_dir first)
class AgentLoopFields:
    r"""
    Agent-loop fields shared by both ThunderSync configs (docs/agents.md). The `agent_max_*` budgets apply to
    `agent_protocol="paper"` only; under `"trl"` a budget that is set is refused.

    Parameters:
        agent_protocol (`str`, *optional*, defaults to `"trl"` for GRPO, `"paper"` for GKD):
            What an episode with tools or `environment_factory` is.
        agent_max_turns (`int`, *optional*):
            Generation turns per trajectory.
        agent_max_tokens_per_turn (`int`, *optional*):
            Generated tokens per turn.
        agent_max_completion_tokens (`int`, *optional*):
            Model-generated tokens per trajectory, all turns.
        agent_max_context_tokens (`int`, *optional*):
            Prompt plus everything appended (actions and observations).
        agent_max_observation_tokens (`int`, *optional*):
            Tool-result tokens kept per observation.
        agent_tool_timeout (`float`, *optional*, defaults to `60.0`):
            Seconds a tool call may take (both protocols).
    """

    GENERATION_BUDGET: ClassVar[GenerationBudget]

    agent_protocol: AgentProtocol = agent_protocol_field("trl")
    agent_max_turns: int | None = field(
        default=None,
        metadata={"help": "agent_protocol='paper': generation turns per trajectory. None: max_tool_calling_iterations "
                  f"+ 1 (GRPO, TRL's field), or {DEFAULT_MAX_TURNS}."},
    )
    agent_max_tokens_per_turn: int | None = field(
        default=None,
        metadata={"help": "agent_protocol='paper': generated tokens per turn. None: the generation budget "
                  "(max_completion_length; GKD: max_new_tokens)."},
    )
    agent_max_completion_tokens: int | None = field(
        default=None,
        metadata={"help": "agent_protocol='paper': model-generated tokens per trajectory, all turns. None: "
                  "max_completion_length (TRL's GRPO budget of the whole completion); GKD: agent_max_turns × the "
                  "per-turn budget (TRL's GKD max_new_tokens bounds one generation)."},
    )
    agent_max_context_tokens: int | None = field(
        default=None,
        metadata={"help": "agent_protocol='paper': prompt + everything appended (actions and observations). None: "
                  f"{DEFAULT_MAX_CONTEXT_TOKENS}. (With 'trl' the model's window applies, as in TRL.)"},
    )
    agent_max_observation_tokens: int | None = field(
        default=None,
        metadata={"help": "agent_protocol='paper': tool-result tokens kept per observation (equal head and tail, "
                  f"marker between). None: {DEFAULT_MAX_OBSERVATION_TOKENS}. (TRL keeps whole results and drops one "
                  "that overflows the budget.)"},
    )
    agent_tool_timeout: float = field(
        default=60.0,
        metadata={"help": "Agent loop (both protocols): seconds a tool call may take before it fails; the failure is "
                  "the tool's result as the protocol renders errors (TRL itself has no timeout)."},
    )

    def check_agent_fields(self) -> None:
        """Validate the agent-loop fields (and TRL's `max_tool_calling_iterations`, which they read)."""
        require_choice(self, "agent_protocol", AgentProtocol)
        # TRL's meaning: 0 = no tool call is executed (one turn), None = the default turn budget
        require_counts(self, ("max_tool_calling_iterations",), minimum=0, optional=True)
        require_counts(self, PAPER_AGENT_FIELDS, optional=True)
        if self.agent_max_observation_tokens is not None and self.agent_max_observation_tokens < 2:
            raise ConfigurationError(f"agent_max_observation_tokens={self.agent_max_observation_tokens} must be ≥ 2 "
                                     "(observations keep at least one head and one tail token)")
        if self.agent_tool_timeout <= 0:
            raise ConfigurationError(f"agent_tool_timeout={self.agent_tool_timeout} must be > 0")
        if self.agent_protocol == "trl":
            for name in PAPER_AGENT_FIELDS:
                if getattr(self, name) is not None:
                    raise ConfigurationError(
                        f"{name}={getattr(self, name)!r} is a budget of agent_protocol='paper'; with "
                        "agent_protocol='trl' TRL's fields bound an episode: max_tool_calling_iterations (tool "
                        f"rounds) and {self.GENERATION_BUDGET.length_field} (the whole multi-turn completion). Set "
                        "agent_protocol='paper' to use it, or leave it None")

    def agent_limits(self) -> AgentLimits | TRLLoopLimits:
        """The agent loop's budgets: TRL's fields (agent_protocol='trl'), or the paper's with TRL's as defaults."""
        from ..envs.harness.agent_loop import AgentLimits
        from ..envs.harness.trl_tool_loop import TRLLoopLimits

        budget = self.GENERATION_BUDGET
        tokens = getattr(self, budget.length_field)
        iterations = self.max_tool_calling_iterations
        if self.agent_protocol == "trl":
            return TRLLoopLimits(max_completion_length=tokens, max_tool_calling_iterations=iterations,
                                 tool_timeout_s=self.agent_tool_timeout)
        turns = self.agent_max_turns
        if turns is None:
            turns = iterations + 1 if iterations is not None else DEFAULT_MAX_TURNS
        per_turn = self.agent_max_tokens_per_turn or tokens
        return AgentLimits(
            max_turns=turns,
            max_tokens_per_turn=per_turn,
            max_completion_tokens=self.agent_max_completion_tokens or (turns * per_turn if budget.per_turn else tokens),
            max_context_tokens=self.agent_max_context_tokens or DEFAULT_MAX_CONTEXT_TOKENS,
            max_observation_tokens=self.agent_max_observation_tokens or DEFAULT_MAX_OBSERVATION_TOKENS,
            tool_timeout_s=self.agent_tool_timeout,
        )
