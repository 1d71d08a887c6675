"""The multi-turn agent loop of one trajectory: a small explicit state machine, tokens in and tokens out.

    context = prompt ids
    repeat:  generate one turn (≤ per-turn budget)          → TurnEvent (action complete)
             parse the tool call (chat-template format)
             no call → stop ("answered");  unparsable → fixed parser-error observation (the turn is consumed)
             run the tool (timeout; exceptions become the observation the model sees)
             observation → truncated to equal head/tail tokens → framed by the chat template → mask 0
                           (its text is data: tokenized so that it never yields a control token, see
                           observation_tokens)
             the tool set `done` (a finishing tool) → stop ("finished")
    until a limit: max_turns, max_completion_tokens (model tokens), max_context_tokens, or a turn cut at its
    per-turn budget ("turn_token_limit"). Limit stops mark the trajectory truncated.

The loop only needs a `generate(context_ids, max_new_tokens, turn) -> (action_ids, logprobs, version)` callable; it
never sees the engine, the learner or other trajectories, so thousands can run concurrently.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from ...types import AgentStats, TurnEvent
from .observation_tokens import valid_text
from .tool_calls import (
    PARSER_ERROR_OBSERVATION,
    ToolResponseRenderer,
    format_tool_result,
    parse_turn,
    truncate_observation,
)

# (context_ids, max_new_tokens, turn) -> (action_ids, sampling logprobs, policy version)
GenerateFn = Callable[[Sequence[int], int, int], tuple[tuple[int, ...], tuple[float, ...], int]]


@dataclass(frozen=True)
class AgentLimits:
    """Budgets of one trajectory (paper Table 6)."""

    max_turns: int = 8
    max_tokens_per_turn: int = 256
    max_completion_tokens: int = 1024  # model-generated tokens over all turns
    max_context_tokens: int = 4096  # prompt + everything appended
    max_observation_tokens: int = 256  # kept per observation: half head, half tail
    tool_timeout_s: float = 60.0  # per tool call (sandboxed commands also have their own)


@dataclass
class AgentTrajectory:
    """The finished trajectory: completion tokens after the prompt, with a 1/0 mask (model/environment)."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)  # assistant and tool messages, for reward functions
    policy_version: int | None = None
    truncated: bool | None = False  # None: TRL's rule (last token neither EOS nor pad), applied by the learner
    stats: AgentStats | None = None

    def add_action(self, index: int, turn: int, action: Sequence[int], logprobs: Sequence[float],
                   version: int) -> None:
        """Append one sampled turn (model tokens, mask 1); every turn of a trajectory must share one policy version."""
        if self.policy_version is None:
            self.policy_version = version
        elif version != self.policy_version:  # caught again by the learner; never mix versions in one trajectory
            raise RuntimeError(f"trajectory {index}: turn {turn} sampled at version {version}, earlier turns at "
                               f"{self.policy_version}")
        self.completion_ids += action
        self.env_mask += [1] * len(action)
        self.logprobs += logprobs


def turn_event(index: int, turn: int, version: int, context: Sequence[int], action: Sequence[int],
               logprobs: Sequence[float]) -> TurnEvent:
    """The event of a completed turn, with the sampler's per-token log-probs when it reported one per token."""
    sampled = tuple(float(x) for x in logprobs) if len(logprobs) == len(action) else None
    return TurnEvent(index, turn, version, tuple(context), tuple(action), time.perf_counter(), sampled)


class ToolRunner:
    """Runs sync tools on a thread pool and async tools on an event loop, each under a timeout."""

    def __init__(self, max_workers: int = 32, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="thundersync-tool")
        self.loop = loop

    def __call__(self, tool: Callable, arguments: dict, timeout: float) -> Any:
        if inspect.iscoroutinefunction(tool):
            if self.loop is None:
                raise RuntimeError("async tools need an event loop (ToolRunner(loop=...))")
            future = asyncio.run_coroutine_threadsafe(tool(**arguments), self.loop)
        else:
            future = self.pool.submit(tool, **arguments)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"tool call did not finish within {timeout:g} s") from None

    def call(self, fn: Callable[[], Any], timeout: float) -> Any:
        """Run a zero-argument callable on the pool under a timeout (the TRL protocol binds the arguments itself)."""
        future = self.pool.submit(fn)
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"tool call did not finish within {timeout:g} s") from None

    def gather(self, coroutines: Sequence[Any], timeout: float) -> list[Any]:
        """Await coroutines together on the loop, each under a timeout; exceptions are returned, not raised."""
        if self.loop is None:
            for coro in coroutines:
                coro.close()
            return [RuntimeError("async tools need an event loop (ToolRunner(loop=...))") for _ in coroutines]

        async def run() -> list[Any]:
            return await asyncio.gather(*(_with_timeout(c, timeout) for c in coroutines), return_exceptions=True)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


async def _with_timeout(coro, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        raise TimeoutError(f"tool call did not finish within {timeout:g} s") from None


def run_agent_trajectory(
    *,
    index: int,
    prompt_ids: Sequence[int],
    tools: dict[str, Callable],
    generate: GenerateFn,
    tokenizer,
    render_tool: ToolResponseRenderer,
    run_tool: ToolRunner,
    limits: AgentLimits,
    environment: Any = None,
    on_turn: Callable[[TurnEvent], None] | None = None,
) -> AgentTrajectory:
    """One trajectory of the paper's protocol (the state machine of the module docstring).

    Longer than ~60 lines on purpose: it is that state machine written out top to bottom, every `break` one stop
    reason, with the budgets and counters in one place; split into helpers, each would need them all.
    """
    traj = AgentTrajectory(prompt_ids=list(prompt_ids))
    schemas = list(tools.values())
    tool_call_start = tokenizer.convert_tokens_to_ids("<tool_call>") if "<tool_call>" in tokenizer.get_vocab() else None
    eos = tokenizer.eos_token_id
    started = time.perf_counter()
    turns = calls = failures = parse_errors = truncations = 0
    tool_intervals: list[tuple[float, float]] = []
    turn_intervals: list[tuple[float, float]] = []
    generated = 0
    stop = "max_turns"
    for turn in range(limits.max_turns):
        context = traj.prompt_ids + traj.completion_ids
        budget = min(limits.max_tokens_per_turn, limits.max_completion_tokens - generated,
                     limits.max_context_tokens - len(context))
        if budget <= 0:
            stop = "max_completion_tokens" if generated >= limits.max_completion_tokens else "max_context_tokens"
            break
        requested = time.perf_counter()
        action, logprobs, version = generate(context, budget, turn)
        turn_intervals.append((requested, time.perf_counter()))
        turns += 1
        generated += len(action)
        traj.add_action(index, turn, action, logprobs, version)
        if on_turn is not None:
            on_turn(turn_event(index, turn, version, context, action, logprobs))
        if not action or action[-1] != eos:
            stop = "turn_token_limit"
            traj.messages.append({"role": "assistant", "content": tokenizer.decode(action, skip_special_tokens=True)})
            break
        parsed = parse_turn(tokenizer, action, context, schemas, tool_call_start)
        traj.messages.append(parsed.message)
        if parsed.malformed:
            parse_errors += 1
            failures += 1
            observation, name = PARSER_ERROR_OBSERVATION, "parser"
        elif parsed.tool_name is None:
            stop = "answered"
            break
        else:
            name = parsed.tool_name
            calls += 1
            tool_start = time.perf_counter()
            observation, failed = _execute(tools, name, parsed.arguments, run_tool, limits.tool_timeout_s)
            tool_intervals.append((tool_start, time.perf_counter()))
            failures += int(failed)
            if parsed.extra_calls:
                observation += f"\n[only one tool call per turn is executed; {parsed.extra_calls} more ignored]"
        observation, elided = truncate_observation(tokenizer, valid_text(observation), limits.max_observation_tokens)
        truncations += int(elided > 0)
        traj.messages.append({"role": "tool", "name": name, "content": observation})
        # A name the model made up is not rendered: it could carry control text into the template's framing.
        framing = render_tool(name if name in tools else "parser", observation)
        if len(context) + len(action) + len(framing) > limits.max_context_tokens:
            stop = "max_context_tokens"
            break
        traj.completion_ids += framing
        traj.env_mask += [0] * len(framing)
        traj.logprobs += [0.0] * len(framing)
        if getattr(environment, "done", False):
            stop = "finished"
            break
    traj.truncated = stop not in ("answered", "finished")
    traj.stats = AgentStats(turns, calls, failures, parse_errors, truncations, tuple(tool_intervals),
                            tuple(turn_intervals), time.perf_counter() - started, stop)
    return traj


def _execute(tools: dict[str, Callable], name: str, arguments: dict, run_tool: ToolRunner,
             timeout: float) -> tuple[str, bool]:
    """Run one tool call; every failure becomes an observation. Returns (observation, failed)."""
    tool = tools.get(name)
    if tool is None:
        return f"Error: unknown tool {name!r}. Available tools: {sorted(tools)}", True
    try:
        result = run_tool(tool, arguments, timeout)
        return format_tool_result(result), False
    except TimeoutError as exc:
        return f"Error: {name} timed out: {exc}", True
    except Exception as exc:  # the model sees what went wrong, as in TRL (also unexpected or missing arguments)
        return f"Error: {name} raised {type(exc).__name__}: {exc}", True
