"""Token-level helpers of the agent loop: parse one turn's tool call, render tool results, truncate observations.

Tokens in, tokens out: the model's action tokens are never re-tokenized. Only environment text (tool results) is
tokenized, as data (`observation_tokens.encode_data`: no text becomes a control token), inside the chat template's own
tool-response framing, and appended with loss mask 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trl.chat_template_utils import parse_response

from ...errors import ConfigurationError
from .observation_tokens import encode_data

# Plain text on purpose: tag markers such as <tool_call> are control tokens, and observations are data (see
# observation_tokens: a marker in an observation is spelled out with ordinary tokens, never made a control token).
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


# What parsing arbitrary model output can raise: malformed JSON or schema (ValueError, which covers JSONDecodeError and
# Python's integer-digit limit for '9' * 5000), wrong types (TypeError), missing fields (KeyError, IndexError), and
# nesting deeper than the interpreter's recursion limit (RecursionError, e.g. 1000 '[' — TRL's parse_response lets it
# through). Each is the model's doing and ends as the parser-error observation, never as a crash.
PARSE_FAILURES = (ValueError, TypeError, KeyError, IndexError, RecursionError)


def parse_turn(tokenizer, action_ids: Sequence[int], context_ids: Sequence[int], tools: Sequence[Callable],
               tool_call_start_id: int | None) -> ParsedTurn:
    attempted = tool_call_start_id is not None and tool_call_start_id in action_ids
    try:
        message = parse_response(tokenizer, list(action_ids), prefix=list(context_ids), tools=list(tools) or None)
    except PARSE_FAILURES:  # a template parser that raises on malformed JSON: same as an unparsable call
        text = tokenizer.decode(list(action_ids), skip_special_tokens=True)
        return ParsedTurn({"role": "assistant", "content": text}, None, None, 0, attempted)
    calls = message.get("tool_calls") or []
    if not calls:
        return ParsedTurn(message, None, None, 0, attempted)
    function = calls[0].get("function") if isinstance(calls, list) and isinstance(calls[0], dict) else None
    if not isinstance(function, dict):
        return ParsedTurn(message, None, None, 0, True)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except PARSE_FAILURES:
            return ParsedTurn(message, None, None, 0, True)
    name = function.get("name")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return ParsedTurn(message, None, None, 0, True)
    return ParsedTurn(message, name, arguments, len(calls) - 1, False)


@dataclass(frozen=True)
class _Frame:
    """How the chat template frames one tool's result after the assistant turn's EOS."""

    prefix: str  # the dummy conversation up to and including that EOS (the same with or without the result)
    before: str  # template text between the EOS and the result (end of line, tool-turn header, opening tag)
    after: str  # template text after the result (closing tag, end of turn, next assistant header)
    before_ids: list[int]  # `before` tokenized as template text: its markers are real control tokens
    after_ids: list[int]


class ToolResponseRenderer:
    """Token ids that frame a tool result after an assistant turn ending in EOS (TRL's dummy-conversation trick).

    The chat template renders `user/assistant(tool_call)` with and without a following tool message; the difference
    after the EOS that closes the assistant turn is the framing, including the next assistant header. This needs a
    prefix-preserving template: pass TRL's training template (`trl.chat_template_utils.get_training_chat_template`,
    what `GRPOTrainer.chat_template` holds) for families such as Qwen3 whose stock template re-renders earlier turns.

    The framing is tokenized as template text (its turn markers are real control tokens); the tool result between
    them is data and goes through `encode_data`, so no text a tool returns can become a control token. The framing
    of each tool name is found once, by rendering a sentinel in place of the result.
    """

    _SENTINEL = "THUNDERSYNC-OBSERVATION-SENTINEL"

    def __init__(self, tokenizer, chat_template: str | None = None, chat_template_kwargs: dict | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        if chat_template is not None:
            self.kwargs["chat_template"] = chat_template
        self._frames: dict[str, _Frame] = {}

    def __call__(self, tool_name: str, content: str) -> list[int]:
        frame = self._frame(tool_name)
        rendered = self._text(tool_name, content)[len(frame.prefix):]
        # what the template made of the content (verbatim for most templates; trimmed or escaped for some)
        fits = (rendered.startswith(frame.before) and rendered.endswith(frame.after)
                and len(rendered) >= len(frame.before) + len(frame.after))
        body = rendered[len(frame.before):len(rendered) - len(frame.after)] if fits else content
        return frame.before_ids + encode_data(self.tokenizer, body) + frame.after_ids

    def _frame(self, tool_name: str) -> _Frame:
        frame = self._frames.get(tool_name)
        if frame is None:
            prefix = self._render(self._dummy(tool_name), add_generation_prompt=False)
            eos = self.tokenizer.eos_token
            if eos and eos in prefix:
                prefix = prefix[: prefix.rindex(eos) + len(eos)]
            full = self._text(tool_name, self._SENTINEL)
            if not full.startswith(prefix):
                raise ConfigurationError("chat template renders a tool message in a way that changes the earlier "
                                         "turns; pass a prefix-preserving template (trl's get_training_chat_template)")
            suffix = full[len(prefix):]
            if suffix.count(self._SENTINEL) != 1:
                raise ConfigurationError("chat template does not render a tool message's content once; cannot tell "
                                         "its framing from the observation")
            before, after = suffix.split(self._SENTINEL)
            frame = _Frame(prefix, before, after, self._encode(before), self._encode(after))
            self._frames[tool_name] = frame
        return frame

    @staticmethod
    def _dummy(tool_name: str) -> list[dict]:
        call = [{"type": "function", "function": {"name": tool_name, "arguments": {}}}]
        return [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]

    def _text(self, tool_name: str, content: str) -> str:
        tool_message = {"role": "tool", "name": tool_name, "content": content}
        return self._render(self._dummy(tool_name) + [tool_message], add_generation_prompt=True)

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False, **self.kwargs)

    def _encode(self, template_text: str) -> list[int]:
        return list(self.tokenizer.encode(template_text, add_special_tokens=False))


def truncate_observation(tokenizer, text: str, max_tokens: int) -> tuple[str, int]:
    """Keep equal head and tail token counts of `text` with a marker saying how many tokens were elided.

    Returns (text, elided token count). `max_tokens` counts only kept tokens, as `encode_data` tokenizes them; the
    marker is extra.
    """
    ids = encode_data(tokenizer, text)
    if len(ids) <= max_tokens:
        return text, 0
    half = max_tokens // 2
    elided = len(ids) - 2 * half
    head = tokenizer.decode(ids[:half])
    tail = tokenizer.decode(ids[len(ids) - half:]) if half else ""
    return f"{head}\n[... {elided} tokens elided ...]\n{tail}", elided


def format_tool_result(result: Any) -> str:
    """Tool return value → observation text (strings as-is, everything else JSON when possible, else `str`)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError, RecursionError):  # not JSON, circular, or nested deeper than the recursion limit
        return str(result)
