"""TRL 1.16's episode, one trajectory at a time: the agent loop of `agent_protocol="trl"` (the default).

`GRPOTrainer._tool_call_loop` runs the batch in lock-step; this is the same state machine per trajectory, so that
thousands run concurrently and each turn is released as soon as it is complete:

    context = prompt ids; generate a turn with the whole completion budget (max_completion_length)
    repeat:  parse the turn (TRL's parse_response; a malformed call parses as text, i.e. no call)
             no parsed call → stop ("answered")
             max_tool_calling_iterations rounds done → stop ("max_tool_calling_iterations"; None = no cap, 0 = the
                 first turn's calls are never run)
             run EVERY call of the turn: sync tools one after another in call order, then the turn's async tools
                 concurrently; an exception (also an unknown tool, wrong arguments) is the result {"error": str(e)}
             each result → {"role": "tool", "name", "content": str(result)} (a list of content blocks as is)
             render all of the turn's tool messages through the chat template (tool_messages), mask 0
             completion + tool tokens > max_completion_length, or prompt + completion + tool tokens ≥ the model
                 window → the tool tokens are dropped, stop ("max_completion_length" / "max_context_tokens"); the
                 tools did run (TRL counts the calls)
             generate the next turn with what is left of max_completion_length (TRL generates more and slices: the
                 same tokens), and never past the model window (where TRL's request would fail)

Deliberate differences, each where TRL would hang, crash or let a tool forge control tokens: a tool call has a
timeout (`tool_timeout_s`; its expiry is rendered like an exception); parser failures TRL lets through
(`tool_calls.PARSE_FAILURES`) and results that cannot be printed end as text, never as a crash; tool results holding
control-token text are tokenized as data (tool_messages). Truncation is TRL's rule, applied by the learner: the last
completion token is neither EOS nor pad.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...types import AgentStats, TurnEvent
from .agent_loop import AgentTrajectory, GenerateFn, ToolRunner, turn_event
from .observation_tokens import valid_text
from .tool_calls import PARSE_FAILURES
from .tool_messages import ToolMessagesRenderer


@dataclass(frozen=True)
class TRLLoopLimits:
    """Budgets of TRL's tool loop (GRPOConfig fields), plus ThunderSync's tool timeout."""

    max_completion_length: int = 256  # every completion token after the prompt: model turns and tool results
    max_tool_calling_iterations: int | None = None  # rounds of tool execution; None: no cap (TRL: sys.maxsize)
    max_context_tokens: int = sys.maxsize  # the model window (TRL: max_position_embeddings); capped by the engine
    tool_timeout_s: float = 60.0  # per tool call; TRL has none (a hung tool hangs it)

    @property
    def max_tokens_per_turn(self) -> int:
        """A turn may use the whole completion budget (TRL generates every turn with max_completion_length)."""
        return self.max_completion_length


def run_trl_trajectory(
    *,
    index: int,
    prompt_ids: Sequence[int],
    tools: dict[str, Callable],
    generate: GenerateFn,
    tokenizer,
    render_tools: ToolMessagesRenderer,
    run_tool: ToolRunner,
    limits: TRLLoopLimits,
    on_turn: Callable[[TurnEvent], None] | None = None,
) -> AgentTrajectory:
    """One trajectory of TRL's episode (the state machine of the module docstring).

    Longer than ~60 lines on purpose: it is that state machine written out top to bottom, next to TRL's
    `_tool_call_loop` it mirrors, every `break` one stop reason; split into helpers, each would need every counter.
    """
    traj = AgentTrajectory(prompt_ids=list(prompt_ids))
    traj.truncated = None  # TRL's rule at the learner: last token neither EOS nor pad
    schemas = list(tools.values())
    cap = limits.max_tool_calling_iterations if limits.max_tool_calling_iterations is not None else sys.maxsize
    started = time.perf_counter()
    turns = calls = failures = parse_errors = iterations = 0
    tool_intervals: list[tuple[float, float]] = []
    turn_intervals: list[tuple[float, float]] = []
    budget = limits.max_completion_length
    while True:
        context = traj.prompt_ids + traj.completion_ids
        # never ask past the model window (vLLM refuses such a request; TRL would fail there): the turn is cut
        budget = min(budget, limits.max_context_tokens - len(context))
        if budget <= 0:
            stop = "max_context_tokens"
            break
        requested = time.perf_counter()
        action, logprobs, version = generate(context, budget, turns)
        turn_intervals.append((requested, time.perf_counter()))
        action = tuple(action)[:budget]
        logprobs = tuple(logprobs)[:len(action)]
        traj.add_action(index, turns, action, logprobs, version)
        if on_turn is not None:
            on_turn(turn_event(index, turns, version, context, action, logprobs))
        turns += 1
        message, tool_calls, attempted = parse_trl_turn(tokenizer, action, context, schemas)
        if message:  # TRL keeps no message for a turn cut to nothing
            traj.messages.append(message)
        parse_errors += int(attempted and not tool_calls)
        if not tool_calls:
            stop = "answered"
            break
        if iterations >= cap:
            stop = "max_tool_calling_iterations"
            break
        tool_start = time.perf_counter()
        results, failed = execute_turn(tools, tool_calls, run_tool, limits.tool_timeout_s)
        tool_intervals.append((tool_start, time.perf_counter()))
        calls += len(tool_calls)
        failures += failed
        tool_messages = [{"role": "tool", "name": name, "content": content} for name, content in results]
        framing = render_tools(tool_messages)
        length = len(traj.completion_ids) + len(framing)
        if length > limits.max_completion_length or len(traj.prompt_ids) + length >= limits.max_context_tokens:
            stop = "max_completion_length" if length > limits.max_completion_length else "max_context_tokens"
            break  # TRL rolls this round's tool messages back; the sample leaves the loop as it is
        traj.messages += tool_messages
        traj.completion_ids += framing
        traj.env_mask += [0] * len(framing)
        traj.logprobs += [0.0] * len(framing)
        iterations += 1
        budget = limits.max_completion_length - len(traj.completion_ids)
        if budget <= 0:  # TRL generates and slices the turn to nothing: no message, no call
            stop = "max_completion_length"
            break
    traj.stats = AgentStats(turns, calls, failures, parse_errors, 0, tuple(tool_intervals), tuple(turn_intervals),
                            time.perf_counter() - started, stop, protocol="trl")
    return traj


def parse_trl_turn(tokenizer, action_ids: Sequence[int], context_ids: Sequence[int],
                   tools: Sequence[Callable]) -> tuple[dict, list, bool]:
    """(assistant message, its tool calls, whether a call was attempted) as TRL's `parse_response` gives them.

    TRL parses `{}` for an empty turn and falls back to the decoded text when parsing fails; it lets some parser
    failures through (`PARSE_FAILURES`), which end as the same text fallback here.
    """
    from trl.chat_template_utils import parse_response

    start = tokenizer.convert_tokens_to_ids("<tool_call>") if "<tool_call>" in tokenizer.get_vocab() else None
    attempted = start is not None and start in action_ids
    if not action_ids:
        return {}, [], False
    try:
        message = parse_response(tokenizer, list(action_ids), prefix=list(context_ids), tools=list(tools) or None)
    except PARSE_FAILURES:
        message = {"role": "assistant", "content": tokenizer.decode(list(action_ids), skip_special_tokens=True)}
    tool_calls = message.get("tool_calls")
    return message, (list(tool_calls) if isinstance(tool_calls, list) and tool_calls else []), attempted


def execute_turn(tools: dict[str, Callable], tool_calls: Sequence[Any], run_tool: ToolRunner,
                 timeout: float) -> tuple[list[tuple[str, Any]], int]:
    """Run every call of a turn as TRL does; returns ([(tool name, message content)], failure count).

    Sync tools run one after another in call order; async tools are started in call order and awaited together
    after them, so their results follow the sync results (TRL's order). A failure is `{"error": str(e)}`.
    """
    results: list[tuple[str, Any]] = []
    pending: list[tuple[str, Any]] = []  # (name, coroutine) of the turn's async calls
    failures = 0
    for call in tool_calls:
        kind = call.get("type") if isinstance(call, dict) else None
        if kind != "function":
            failures += 1
            name = call.get("name", "unknown") if isinstance(call, dict) else "unknown"
            results.append((name, {"error": f"Unsupported tool call type: {kind}"}))
            continue
        function = call["function"]
        name = function["name"]
        try:
            tool = tools.get(name)
            if tool is None:
                raise ValueError(f"Tool {name} not found.")
            if inspect.iscoroutinefunction(tool):
                pending.append((name, _bound(tool, function["arguments"])()))
            else:
                results.append((name, run_tool.call(_bound(tool, function["arguments"]), timeout)))
        except Exception as exc:  # TRL: the model sees str(e)
            failures += 1
            results.append((name, {"error": str(exc)}))
    if pending:
        outcomes = run_tool.gather([coro for _, coro in pending], timeout)
        for (name, _), outcome in zip(pending, outcomes, strict=True):
            if isinstance(outcome, Exception):
                failures += 1
                outcome = {"error": str(outcome)}
            results.append((name, outcome))
    return [(name, _content(result)) for name, result in results], failures


def _bound(tool: Callable, arguments: Any) -> Callable[[], Any]:
    """`tool(**arguments)` as TRL writes it (a non-mapping raises TRL's TypeError when called)."""
    return lambda: tool(**arguments)


def _content(result: Any) -> Any:
    """TRL's tool message content: a list (content blocks) as is, anything else `str(result)`."""
    if isinstance(result, list):
        return result
    try:
        return valid_text(str(result))
    except Exception as exc:  # e.g. RecursionError printing a deeply nested value (TRL would crash)
        return str({"error": f"the result could not be printed: {type(exc).__name__}: {exc}"})

