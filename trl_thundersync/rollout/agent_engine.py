"""`AgentRolloutEngine`: every trajectory of a batch is a concurrent multi-turn agent loop.

Implements the `RolloutEngine` contract on top of any `TurnGenerator` (`engine.py`: `submit(request, key=...,
max_new_tokens=...) -> Future[Rollout]`, `publish`, `policy_version`, `close`; `LocalProcessEngine`,
`VLLMServerEngine`). `agent_setup.make_agent_engine` builds one the way both trainers do. One generation request per
turn; a trajectory waiting for a tool never blocks the others, because each loop runs in its
own thread and tools run on a separate pool. Finished trajectories are handed out in completion order with their
1/0 model/environment mask, and each turn emits a `TurnEvent` as soon as its action tokens are complete.

Environments follow TRL's `environment_factory` contract: `reset(**row) -> str | None` (appended to the last user
message, tokenized as data: its text never becomes a control token), public methods are tools, optional
`get_reward()`, and optionally a `done` attribute that a finishing tool sets (read by the paper protocol only; TRL has
no such notion). Instances are pooled per environment name and reset for every trajectory. The episode is TRL's
(`TRLLoopLimits`, envs/trl_tool_loop) or the paper's (`AgentLimits`, envs/agent_loop), chosen by the limits passed.
"""

from __future__ import annotations

import inspect
import queue
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..envs.harness.agent_loop import AgentLimits, ToolRunner, run_agent_trajectory
from ..envs.harness.observation_tokens import contains_control_text, encode_data, valid_text
from ..envs.harness.tool_calls import ToolResponseRenderer
from ..envs.harness.tool_messages import ToolMessagesRenderer
from ..envs.harness.trl_tool_loop import TRLLoopLimits, run_trl_trajectory
from ..errors import RolloutError, UnknownEnvironmentError
from ..types import Rollout, RolloutRequest, TurnEvent
from .engine import TurnGenerator, engine_step_metrics

# (prompt messages, tool callables) -> prompt token ids, rendered with the chat template and a generation prompt
RenderPromptFn = Callable[[list[dict], list[Callable]], list[int]]


def environment_tools(environment: Any) -> list[Callable]:
    """Public methods of an environment instance other than reset/get_reward: its tools (TRL's rule)."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def turn_seed(trajectory_seed: int, turn: int) -> int:
    return (trajectory_seed * 2_654_435_761 + turn * 40_503 + 17) % (2**63 - 1)


@dataclass(frozen=True)
class EnvironmentSpec:
    """Where tools come from for the batch."""

    factories: Mapping[str | None, Callable[[], Any]] | None  # environment name -> factory (None key: single env)
    standalone_tools: Sequence[Callable]  # plain `tools=[...]` functions
    multi_environment: bool = False  # rows select their environment by an `environment` column


class AgentRolloutEngine:
    def __init__(self, generator: TurnGenerator, *, tokenizer, render_prompt: RenderPromptFn,
                 limits: AgentLimits | TRLLoopLimits,
                 environments: EnvironmentSpec, tool_runner: ToolRunner | None = None,
                 chat_template: str | None = None, chat_template_kwargs: dict | None = None,
                 on_turn: Callable[[TurnEvent], None] | None = None, max_concurrent: int = 64) -> None:
        self.generator = generator
        self.tokenizer = tokenizer
        self.render_prompt = render_prompt
        self.limits = limits
        self.spec = environments
        self.tool_runner = tool_runner or ToolRunner()
        self.chat_template = chat_template  # what prompts and tool framings are rendered with (None: the tokenizer's)
        self.render_tool = ToolResponseRenderer(tokenizer, chat_template, chat_template_kwargs)
        self.render_tools = ToolMessagesRenderer(tokenizer, chat_template, chat_template_kwargs)
        self.on_turn = on_turn
        self.pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="thundersync-agent")
        self.environments: list[Any] = []  # per trajectory index of the open (or last) batch
        self._env_pool: dict[str | None, list[Any]] = {}
        self._done: queue.Queue | None = None
        self._expected = 0
        self.policy_version = getattr(generator, "policy_version", 0)

    # -- RolloutEngine ---------------------------------------------------------------------------------------------
    def start_batch(self, requests: Sequence[RolloutRequest], policy_version: int) -> None:
        if self._done is not None:
            raise RolloutError("a batch is still open")
        if policy_version != self.generator.policy_version:
            raise RolloutError(f"the generator serves version {self.generator.policy_version}, the batch asks for "
                               f"{policy_version}; publish first")
        self.environments = self._draw_environments(requests)
        self._done, self._expected = queue.Queue(), len(requests)
        for request in requests:
            future = self.pool.submit(self._trajectory, request, self.environments[request.index])
            future.add_done_callback(self._done.put)

    def results(self) -> Iterator[Rollout]:
        if self._done is None:
            raise RolloutError("results() called without start_batch()")
        try:
            for _ in range(self._expected):
                yield self._done.get().result()
        finally:
            self._done = None

    def publish(self, model: Any, policy_version: int) -> float:
        seconds = self.generator.publish(model, policy_version)
        self.policy_version = policy_version
        return seconds

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.tool_runner.close()
        self.generator.close()

    def step_metrics(self) -> dict[str, float]:
        """The turn generator's metrics (the agent loop's own are computed from the rollouts' `AgentStats`)."""
        return engine_step_metrics(self.generator)

    def adopt_environments(self, instances: Mapping[str | None, Any]) -> None:
        """Put instances created ahead of the first batch (one per environment name, as TRL probes them) first in
        their pools, so that they serve trajectories instead of being wasted."""
        for name, instance in instances.items():
            self._env_pool.setdefault(name, []).insert(0, instance)

    # -- one trajectory -------------------------------------------------------------------------------------------
    def _trajectory(self, request: RolloutRequest, environment: Any) -> Rollout:
        started = time.perf_counter()
        row = dict(request.row or {})
        prompt = [dict(m) for m in request.prompt]
        tools = list(self.spec.standalone_tools)
        if environment is not None:
            reset_kwargs = {k: v for k, v in row.items() if k != "environment"} if self.spec.multi_environment else row
            try:
                observation = environment.reset(**reset_kwargs)
            except Exception as exc:
                raise RolloutError(f"trajectory {request.index}: {type(environment).__name__}.reset raised "
                                   f"{type(exc).__name__}: {exc}") from exc
            tools += environment_tools(environment)
            if observation is not None:
                prompt_ids = self._prompt_with_observation(request.index, prompt, tools, valid_text(observation))
            else:
                prompt_ids = self.render_prompt(prompt, tools)
        else:
            prompt_ids = self.render_prompt(prompt, tools)

        def generate(context, max_new_tokens, turn):
            sub = RolloutRequest(index=request.index, group=request.group, prompt_ids=tuple(context),
                                 seed=turn_seed(request.seed, turn))
            result = self.generator.submit(sub, key=(request.index, turn), max_new_tokens=max_new_tokens).result()
            return result.completion_ids, result.sampling_logprobs or (), result.policy_version

        if isinstance(self.limits, TRLLoopLimits):  # agent_protocol="trl": TRL's episode
            traj = run_trl_trajectory(
                index=request.index, prompt_ids=prompt_ids, tools={t.__name__: t for t in tools}, generate=generate,
                tokenizer=self.tokenizer, render_tools=self.render_tools, run_tool=self.tool_runner,
                limits=self.limits, on_turn=self.on_turn,
            )
        else:  # agent_protocol="paper"
            traj = run_agent_trajectory(
                index=request.index, prompt_ids=prompt_ids, tools={t.__name__: t for t in tools}, generate=generate,
                tokenizer=self.tokenizer, render_tool=self.render_tool, run_tool=self.tool_runner,
                limits=self.limits, environment=environment, on_turn=self.on_turn,
            )
        version = traj.policy_version if traj.policy_version is not None else self.generator.policy_version
        return Rollout(
            index=request.index, group=request.group, policy_version=version,
            prompt_ids=tuple(traj.prompt_ids), completion_ids=tuple(traj.completion_ids),
            env_mask=tuple(traj.env_mask), sampling_logprobs=tuple(traj.logprobs), completion=traj.messages,
            started_at=started, finished_at=time.perf_counter(), truncated=traj.truncated, agent=traj.stats,
        )

    def _prompt_with_observation(self, index: int, prompt: list[dict], tools: list[Callable],
                                 observation: str) -> list[int]:
        """Prompt ids with `reset()`'s text appended to the last user message, that text tokenized as data.

        Text without control-token strings renders as TRL renders it. Otherwise the prompt is rendered with a
        placeholder special token where the text goes (special tokens split the tokenization, so the ids on both
        sides are what the template gives), and the placeholder is replaced by `encode_data(text)`.
        """
        def render(text: str) -> list[int]:
            return self.render_prompt(prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + text}], tools)

        if not contains_control_text(self.tokenizer, observation):
            return render(observation)
        base = render("")
        for placeholder in self._placeholders():
            placeholder_id = self.tokenizer.convert_tokens_to_ids(placeholder)
            if placeholder_id in base:
                continue
            ids = render(placeholder)
            if ids.count(placeholder_id) == 1:
                at = ids.index(placeholder_id)
                return ids[:at] + encode_data(self.tokenizer, observation) + ids[at + 1:]
        raise RolloutError(f"trajectory {index}: no special token of {type(self.tokenizer).__name__} can stand in for "
                           "the reset() text, so it cannot be tokenized apart from the template")

    def _placeholders(self) -> list[str]:
        """Special tokens that render as one id, the padding token first (templates rarely write it)."""
        tok = self.tokenizer
        names = [tok.pad_token] + [t for t in tok.all_special_tokens if t != tok.pad_token]
        return [t for t in names if t and tok.encode(t, add_special_tokens=False) == [tok.convert_tokens_to_ids(t)]]

    def _draw_environments(self, requests: Sequence[RolloutRequest]) -> list[Any]:
        out: list[Any] = [None] * (max((r.index for r in requests), default=-1) + 1)
        factories = self.spec.factories
        if not factories:
            return out
        cursor: dict[str | None, int] = {}
        names = [(request.row or {}).get("environment") if self.spec.multi_environment else None
                 for request in requests]
        for name in names:  # the whole batch is checked before any instance is drawn, as in TRL
            if name not in factories:
                raise UnknownEnvironmentError(  # trl.GRPOTrainer's text
                    f"Example has `environment={name!r}`, which is not among the environments passed to "
                    f"`environment_factory`. Expected one of: {list(factories)}.")
        for request, name in zip(requests, names, strict=True):
            pool = self._env_pool.setdefault(name, [])
            k = cursor.get(name, 0)
            if k == len(pool):
                pool.append(factories[name]())
            cursor[name] = k + 1
            out[request.index] = pool[k]
        return out
