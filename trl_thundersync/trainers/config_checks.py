"""Size fields that must be positive integers, refused at config construction (not by an untyped error mid-run).

TRL and transformers accept `max_completion_length=0`, `per_device_train_batch_size=0`,
`gradient_accumulation_steps=0`, ... and fail later, deep in generation or in a modulo; some (`num_generations=0`,
`per_device_train_batch_size=None`) raise a `ZeroDivisionError` / `TypeError` from TRL's own `__post_init__`. The
configs call `require_counts` first, so each such value is a `ConfigurationError` naming the field, the value and
what it must be. Values TRL gives a meaning to stay accepted (`max_tool_calling_iterations=0`: no tool calls;
`None` where TRL documents `None`).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigurationError


def require_counts(config, names: Iterable[str], *, minimum: int = 1, optional: bool = False) -> None:
    """Each named field must be an int ≥ `minimum` (or None when `optional`)."""
    for name in names:
        value = getattr(config, name)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            allowed = f"an integer ≥ {minimum}" + (" (or None)" if optional else "")
            raise ConfigurationError(f"{type(config).__name__}: {name}={value!r} must be {allowed}")
