"""Token ids of one turn's tool messages, rendered as TRL 1.16 renders them (`GRPOTrainer._get_tool_suffix_ids`).

TRL renders `user/assistant(tool_call)` with and without the turn's tool messages (and a generation prompt), trims
the first rendering after its last EOS, tokenizes both through the chat template and keeps the difference: every
tool message of the turn in one piece of template (Qwen3 puts them in one `user` turn), followed by the next
assistant header.

    ids = ToolMessagesRenderer(tokenizer, chat_template)([{"role": "tool", "name": "add", "content": "42"}, ...])

The difference from TRL is deliberate and only shows when a tool result contains the text of an added token
(`<|im_end|>`, `<tool_call>`, ...): TRL tokenizes that text as template text, so a tool could forge turn markers in
the policy's context; here the contents are then tokenized as data (`observation_tokens.encode_data`) between the
template's own framing. Text without such strings gets exactly TRL's ids (the rendered suffix tokenized in one call:
the EOS that ends the trimmed prefix is an added token, so the tokenizer splits there and TRL's slice is the same).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigurationError
from .observation_tokens import contains_control_text, control_vocabulary, encode_data

_SENTINEL = "THUNDERSYNC-TOOL-RESULT-{}-SENTINEL"
# the dummy call's name when the model's own name could carry control text into the framing (a made-up name)
_SAFE_NAME = "unknown_tool"


class ToolMessagesRenderer:
    """Framing + contents of a turn's tool messages, as token ids (loss mask 0 in the agent loop)."""

    def __init__(self, tokenizer, chat_template: str | None = None, chat_template_kwargs: dict | None = None) -> None:
        self.tokenizer = tokenizer
        self.kwargs = dict(chat_template_kwargs or {})
        if chat_template is not None:
            self.kwargs["chat_template"] = chat_template

    def __call__(self, tool_messages: Sequence[dict]) -> list[int]:
        messages = [self._safe(m) for m in tool_messages]
        suffix = self._suffix(messages)
        if not any(contains_control_text(self.tokenizer, text) for m in messages for text in _texts(m["content"])):
            ids = self._encode(suffix)
            framing = self._framing(messages)
            forbidden = control_vocabulary(self.tokenizer).forbidden
            # the template's own markers are the only control tokens (a normalizer could make one of marker-free text)
            if framing is None or _count(ids, forbidden) == sum(_count(self._encode(f), forbidden) for f in framing):
                return ids
        return self._as_data(messages)

    # -- TRL's rendering ------------------------------------------------------------------------------------------
    def _suffix(self, messages: list[dict]) -> str:
        """What the tool messages add after the EOS-trimmed dummy prefix, as `_get_tool_suffix_ids` slices it."""
        dummy = self._dummy(messages[0]["name"])
        prefix = self._render(dummy, add_generation_prompt=False)
        eos = self.tokenizer.eos_token
        if eos and eos in prefix:
            prefix = prefix[: prefix.rindex(eos) + len(eos)]
        full = self._render(dummy + messages, add_generation_prompt=True)
        if not full.startswith(prefix):
            raise ConfigurationError("chat template renders a tool message in a way that changes the earlier turns; "
                                     "pass a prefix-preserving template (trl's get_training_chat_template)")
        return full[len(prefix):]

    def _framing(self, messages: list[dict]) -> list[str] | None:
        """The suffix's template text around each string content (None: a content is not a string, or the template
        does not render each sentinel exactly once, in order)."""
        if not all(isinstance(m["content"], str) for m in messages):
            return None
        sentinels = [_SENTINEL.format(i) for i in range(len(messages))]
        stand_ins = [{**m, "content": s} for m, s in zip(messages, sentinels, strict=True)]
        suffix = self._suffix(stand_ins)
        pieces = []
        for sentinel in sentinels:
            if suffix.count(sentinel) != 1:
                return None
            before, suffix = suffix.split(sentinel)
            pieces.append(before)
        return pieces + [suffix]

    # -- control text in a result: contents as data between the template's framing --------------------------------
    def _as_data(self, messages: list[dict]) -> list[int]:
        # content blocks with control text: their text parts, as one string (the data must stay data)
        messages = [m if isinstance(m["content"], str) else {**m, "content": "".join(_texts(m["content"]))}
                    for m in messages]
        framing = self._framing(messages)
        if framing is None:
            raise ConfigurationError("a tool result holds control-token text, and the chat template does not render "
                                     "each tool message's content once; it cannot be tokenized as data")
        ids = self._encode(framing[0])
        for message, after in zip(messages, framing[1:], strict=True):
            ids += encode_data(self.tokenizer, message["content"]) + self._encode(after)
        return ids

    # -- helpers ----------------------------------------------------------------------------------------------------
    def _safe(self, message: dict) -> dict:
        name = message.get("name")
        if not isinstance(name, str) or contains_control_text(self.tokenizer, name):
            name = _SAFE_NAME
        return {"role": "tool", "name": name, "content": message["content"]}

    @staticmethod
    def _dummy(tool_name: str) -> list[dict]:
        call = [{"type": "function", "function": {"name": tool_name, "arguments": {}}}]
        return [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                  tokenize=False, **self.kwargs)

    def _encode(self, template_text: str) -> list[int]:
        return list(self.tokenizer.encode(template_text, add_special_tokens=False))


def _texts(content) -> list[str]:
    """The text of a tool message's content: a string, or the text parts of a list of content blocks."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def _count(ids: Sequence[int], forbidden: frozenset[int]) -> int:
    return sum(1 for i in ids if i in forbidden)
