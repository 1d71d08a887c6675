"""Token-level helpers of the agent loop: parse one turn's tool call, render tool results, truncate observations.

Tokens in, tokens out: the model's action tokens are never re-tokenized. Only environment text (tool results) is
tokenized, with the chat template's own tool-response framing, and appended with loss mask 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trl.chat_template_utils import parse_response

# Plain text on purpose: tag markers such as <tool_call> are special tokens and must not appear in observations.
PARSER_ERROR_OBSERVATION = (
    "Error: the tool call could not be parsed. Call exactly one tool per turn: a JSON object with a \"name\" and an "
    "\"arguments\" object, inside the tool-call tags."
)


@dataclass(frozen=True)
class ParsedTurn:
    """What the model did in one turn."""

    message: dict  # the assistant message as TRL's parse_response returns it (content, optional tool_calls)
    tool_name: str | None  # the first tool call's function name, None if no call
    arguments: dict | None  # its arguments
    extra_calls: int  # tool calls beyond the first (ignored: at most one call per turn)
    malformed: bool  # a tool call was attempted (start marker present) but could not be parsed


def parse_turn(tokenizer, action_ids: Sequence[int], context_ids: Sequence[int], tools: Sequence[Callable],
               tool_call_start_id: int | None) -> ParsedTurn:
    attempted = tool_call_start_id is not None and tool_call_start_id in action_ids
    try:
        message = parse_response(tokenizer, list(action_ids), prefix=list(context_ids), tools=list(tools) or None)
    except Exception:  # a template parser that raises on malformed JSON: same as an unparsable call
        text = tokenizer.decode(list(action_ids), skip_special_tokens=True)
        return ParsedTurn({"role": "assistant", "content": text}, None, None, 0, attempted)
    calls = message.get("tool_calls") or []
    if not calls:
        return ParsedTurn(message, None, None, 0, attempted)
    function = calls[0].get("function", {})
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ParsedTurn(message, None, None, 0, True)
    name = function.get("name")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return ParsedTurn(message, None, None, 0, True)
    return ParsedTurn(message, name, arguments, len(calls) - 1, False)


class ToolResponseRenderer:
    """Token ids that frame a tool result after an assistant turn ending in EOS (TRL's dummy-conversation trick).

    The chat template renders `user/assistant(tool_call)` with and without a following tool message; the difference
    after the EOS that closes the assistant turn is the framing, including the next assistant header. This needs a
    prefix-preserving template: pass TRL's training template (`trl.chat_template_utils.get_training_chat_template`,
    what `GRPOTrainer.chat_template` holds) for families such as Qwen3 whose stock template re-renders earlier turns.
    """

    def __init__(self, tokenizer, chat_template: str | None = None, chat_template_kwargs: dict | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        if chat_template is not None:
            self.kwargs["chat_template"] = chat_template

    def __call__(self, tool_name: str, content: str) -> list[int]:
        call = [{"type": "function", "function": {"name": tool_name, "arguments": {}}}]
        dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
        tool_message = [{"role": "tool", "name": tool_name, "content": content}]
        prefix = self._ids(dummy, add_generation_prompt=False)
        full = self._ids(dummy + tool_message, add_generation_prompt=True)
        eos = self.tokenizer.eos_token_id
        ends = [i for i, t in enumerate(prefix) if t == eos]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("chat template renders a tool message in a way that changes the earlier turns")
        return full[len(prefix):]

    def _ids(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                 tokenize=True, return_dict=False, **self.kwargs)
        return list(out)


def truncate_observation(tokenizer, text: str, max_tokens: int) -> tuple[str, int]:
    """Keep equal head and tail token counts of `text` with a marker saying how many tokens were elided.

    Returns (text, elided token count). `max_tokens` counts only kept tokens; the marker is extra.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text, 0
    half = max_tokens // 2
    elided = len(ids) - 2 * half
    head = tokenizer.decode(ids[:half])
    tail = tokenizer.decode(ids[len(ids) - half:]) if half else ""
    return f"{head}\n[... {elided} tokens elided ...]\n{tail}", elided


def format_tool_result(result: Any) -> str:
    """Tool return value → observation text (strings as-is, everything else JSON when possible)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
