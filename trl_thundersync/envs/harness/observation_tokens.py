"""Environment text → token ids that are never control tokens: observations are data.

A tool's output, a tool error, the parser-error message and an environment's `reset()` text are written by the
environment (and, through it, by the code the agent runs). Tokenized like template text, a literal
`<|im_end|>\\n<|im_start|>user\\n...` in a tool's output would become the real turn markers and forge a user turn or a
tool call in the policy's context. `encode_data` tokenizes such text in pieces cut inside every added-token string,
special or not (Qwen's `<tool_call>` is an added token with `special=False`, which `split_special_tokens=True` does
not split), so the vocabulary's ordinary tokens spell the marker out. For byte-level BPE tokenizers (Qwen, Llama 3,
GPT-2 style) `decode(encode_data(text)) == text`. Text without any added-token string is encoded in one call, exactly
as before.

    ids = encode_data(tokenizer, observation)       # no id of an added or special token, whatever the text says
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

from ...errors import RolloutError


@dataclass(frozen=True)
class ControlVocabulary:
    """The tokenizer's control tokens: what environment text must never tokenize to."""

    pattern: re.Pattern | None  # matches any added-token string longer than one character (None: there are none)
    forbidden: frozenset[int]  # ids of those tokens and of every special token


# tokenizer -> (vocabulary size when computed, its control vocabulary); weak, so tokenizers are not kept alive
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def control_vocabulary(tokenizer) -> ControlVocabulary:
    """Added and special tokens of `tokenizer` (cached per tokenizer object; recomputed when tokens are added)."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else -1
    cacheable = _weakly_referenceable(tokenizer)
    cached = _CACHE.get(tokenizer) if cacheable else None
    if cached is not None and cached[0] == size:
        return cached[1]
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    added = {i: str(getattr(t, "content", t)) for i, t in decoder.items()}
    splittable = {i: s for i, s in added.items() if len(s) > 1}
    # longest first, so that at one position the longest marker is the one found (the cut is the same either way)
    strings = sorted(set(splittable.values()), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
    forbidden = frozenset(splittable) | frozenset(getattr(tokenizer, "all_special_ids", None) or ())
    vocab = ControlVocabulary(pattern, forbidden)
    if cacheable:
        _CACHE[tokenizer] = (size, vocab)
    return vocab


def _weakly_referenceable(obj) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


def contains_control_text(tokenizer, text: str) -> bool:
    """Whether `text` holds the string of an added token (a normal tokenization would make it a control token)."""
    pattern = control_vocabulary(tokenizer).pattern
    return pattern is not None and pattern.search(text) is not None


def split_inside_markers(text: str, pattern: re.Pattern) -> list[str]:
    """Cut `text` one character into every match of `pattern`: no piece contains a whole marker.

    The next search starts at the cut, so overlapping markers are cut too. A marker that ends inside a piece would
    have to start at or after the previous cut, i.e. be the leftmost match itself, which is cut after its first
    character; single-character markers are not in the pattern.
    """
    pieces, start = [], 0
    while (match := pattern.search(text, start)) is not None:
        cut = match.start() + 1
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return [p for p in pieces if p]


def encode_data(tokenizer, text: str) -> list[int]:
    """Token ids of environment text in which no added or special token is recognized."""
    vocab = control_vocabulary(tokenizer)
    if vocab.pattern is None or vocab.pattern.search(text) is None:
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if vocab.forbidden.isdisjoint(ids):
            return ids
        pieces = list(text)  # a normalizer made a control token of marker-free text: spell it character by character
    else:
        pieces = split_inside_markers(text, vocab.pattern)
    ids = []
    for piece in pieces:
        piece_ids = _encode_piece(tokenizer, piece)
        if not vocab.forbidden.isdisjoint(piece_ids):
            piece_ids = [i for ch in piece for i in _encode_piece(tokenizer, ch)]
        ids += piece_ids
    if not vocab.forbidden.isdisjoint(ids):
        raise RolloutError(f"{type(tokenizer).__name__} turns the environment text {text[:80]!r} into a control token "
                           "even character by character; this tokenizer cannot keep observations as data")
    return ids


def _encode_piece(tokenizer, piece: str) -> list[int]:
    # No piece holds a whole marker, so the plain encoding is safe; the caller checks the ids anyway. Never pass
    # `split_special_tokens=True` here: a fast tokenizer implements it by flipping a flag on its shared backend
    # (`_tokenizer.encode_special_tokens`), which races with the template encodings other trajectories' threads run
    # at the same time (their real turn markers came out spelled as text).
    return list(tokenizer.encode(piece, add_special_tokens=False))


def valid_text(text: str) -> str:
    """`text` with characters UTF-8 cannot encode (lone surrogates, e.g. from `surrogateescape`) written as escapes.

    Tokenizers refuse such strings; an observation must reach the model whatever bytes a tool produced.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
