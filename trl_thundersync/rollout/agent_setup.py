"""`make_agent_engine`: the multi-turn agent engine over a `TurnGenerator`, wired as both trainers (and the benchmark's
stock-TRL side) wire it.

    engine = make_agent_engine(generator, processing_class=tokenizer, limits=args.agent_limits(),
                               tools=tools, environment_factory=MyEnv, on_turn=router, policy=model)

Prompts are rendered as `trl.GRPOTrainer` renders them with tools: `processing_class.apply_chat_template(prompt,
tools=..., chat_template=..., add_generation_prompt=True, **chat_template_kwargs)`, where the template is TRL's rule
(`agent_chat_template`): when the trainer has tools and the tokenizer's own template is not prefix-preserving,
TRL's training template (`get_training_chat_template`), else the tokenizer's own. "Has tools" is TRL's too: plain
`tools`, or a public method on an environment; to know the latter, one instance of each environment is created
ahead (TRL probes them the same way) and handed to the engine's pool, so none is wasted. The context budget is capped
by what the model and the generator's servers can hold (`capped_agent_limits`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..envs.harness.agent_loop import AgentLimits, ToolRunner
from ..envs.harness.trl_tool_loop import TRLLoopLimits
from .agent_engine import AgentRolloutEngine, EnvironmentSpec, environment_tools
from .engine import TurnGenerator

EnvironmentFactory = Callable[[], Any]  # TRL's environment_factory: () -> an instance with reset(**row)


def agent_chat_template(processing_class: Any, has_tools: bool) -> str | None:
    """The chat template multi-turn prompts are rendered with: TRL GRPOTrainer's rule (None: the tokenizer's own).

    Multi-turn token histories need a prefix-preserving template; TRL swaps in its training template only when the
    trainer has tools and the tokenizer's template is not one."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    if has_tools and not is_chat_template_prefix_preserving(processing_class):
        return get_training_chat_template(processing_class)
    return None


def capped_agent_limits(limits: AgentLimits | TRLLoopLimits, policy: Any,
                        generator: Any) -> AgentLimits | TRLLoopLimits:
    """The agent limits with the context budget capped by what the model (and the rollout servers) can hold, so a
    long trajectory ends with `max_context_tokens` instead of a request the server refuses."""
    windows = [getattr(getattr(policy, "config", None), "max_position_embeddings", None),
               getattr(generator, "max_model_len", None)]
    windows = [w for w in windows if isinstance(w, int) and w > 0]
    if windows and min(windows) < limits.max_context_tokens:
        return replace(limits, max_context_tokens=min(windows))
    return limits


def environment_factories(environment_factory: EnvironmentFactory | Mapping[str, EnvironmentFactory] | None
                          ) -> tuple[dict[str | None, EnvironmentFactory] | None, bool]:
    """TRL's normalization: (environment name -> factory, whether rows select theirs by an `environment` column).

    One callable is the unnamed (None) environment every row uses, and so is TRL's normalized form of it,
    `{None: factory}` (`GRPOTrainer.environment_factories`); any other mapping selects by name."""
    if environment_factory is None:
        return None, False
    if isinstance(environment_factory, Mapping):
        return dict(environment_factory), None not in environment_factory
    return {None: environment_factory}, False


def make_agent_engine(generator: TurnGenerator, *, processing_class: Any, limits: AgentLimits | TRLLoopLimits,
                      tools: Sequence[Callable] = (),
                      environment_factory: EnvironmentFactory | Mapping[str, EnvironmentFactory] | None = None,
                      tokenizer: Any = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                      has_tools: bool | None = None, tool_runner: ToolRunner | None = None,
                      on_turn: Callable | None = None, max_concurrent: int = 64,
                      policy: Any = None) -> AgentRolloutEngine:
    """The `AgentRolloutEngine` over `generator` (see the module docstring).

    `tokenizer` (default `processing_class`) tokenizes tool results; `has_tools` is what TRL's rule reads (None:
    decided here, creating one instance of each environment ahead); `policy` (the unwrapped model) caps the context
    budget by its position embeddings."""
    factories, multi_environment = environment_factories(environment_factory)
    probes = {name: factory() for name, factory in factories.items()} if factories and has_tools is None else {}
    if has_tools is None:
        has_tools = bool(tools) or any(environment_tools(instance) for instance in probes.values())
    template = agent_chat_template(processing_class, has_tools)
    template_kwargs = dict(chat_template_kwargs or {})

    def render_prompt(prompt: list[dict], prompt_tools: list) -> list[int]:
        out = processing_class.apply_chat_template(
            conversation=prompt, tools=prompt_tools or None, chat_template=template, add_generation_prompt=True,
            tokenize=True, return_dict=True, **template_kwargs)  # `or None`: TRL's guard (Llama renders tools=[])
        return list(out["input_ids"])

    spec = EnvironmentSpec(factories=factories, standalone_tools=list(tools), multi_environment=multi_environment)
    engine = AgentRolloutEngine(
        generator, tokenizer=tokenizer if tokenizer is not None else processing_class, render_prompt=render_prompt,
        limits=capped_agent_limits(limits, policy, generator), environments=spec,
        tool_runner=tool_runner or ToolRunner(), chat_template=template, chat_template_kwargs=template_kwargs,
        on_turn=on_turn, max_concurrent=max_concurrent)
    engine.adopt_environments(probes)
    return engine
