"""Size fields that must be positive integers, refused at config construction (not by an untyped error mid-run).

TRL and transformers accept `max_completion_length=0`, `per_device_train_batch_size=0`,
`gradient_accumulation_steps=0`, ... and fail later, deep in generation or in a modulo; some (`num_generations=0`,
`per_device_train_batch_size=None`) raise a `ZeroDivisionError` / `TypeError` from TRL's own `__post_init__`. The
configs call `require_counts` first, so each such value is a `ConfigurationError` naming the field, the value and
what it must be. Values TRL gives a meaning to stay accepted (`max_tool_calling_iterations=0`: no tool calls;
`None` where TRL documents `None`). `require_choice` does the same for a string option typed as a `Literal`: the
allowed values are the alias's `typing.get_args`, so the check and the annotation cannot drift apart.

`converted_config` turns a plain TRL config (what a user of stock TRL already has) into the ThunderSync config that
extends it, so the refusals above and in each config's `__post_init__` apply to the user's own values.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import fields
from typing import Any, get_args

from ..errors import ConfigurationError, UnsupportedOptionError


def require_counts(config, names: Iterable[str], *, minimum: int = 1, optional: bool = False) -> None:
    """Each named field must be an int ≥ `minimum` (or None when `optional`)."""
    for name in names:
        value = getattr(config, name)
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            allowed = f"an integer ≥ {minimum}" + (" (or None)" if optional else "")
            raise ConfigurationError(f"{type(config).__name__}: {name}={value!r} must be {allowed}")


def require_choice(config, name: str, options: Any, allowed: tuple[str, ...] | None = None) -> None:
    """The field `name` must be one of the `Literal` alias `options` (or of `allowed`, a subset of it that this
    config accepts)."""
    allowed = get_args(options) if allowed is None else allowed
    value = getattr(config, name)
    if value not in allowed:
        raise ConfigurationError(f"{name}={value!r} is not one of {allowed}")


def converted_config(config, target: type, *, rederived: Iterable[str] = ()):
    """`config`, an instance of a TRL config that `target` extends, as a `target`.

    Every init field of `config` is carried over by value (the values its `__post_init__` already resolved: output_dir,
    bf16, report_to, ...), the fields `target` adds take their defaults, and `target.__post_init__` runs on them:
    TRL's checks again, then ThunderSync's refusals, which name the user's field. `rederived` names fields that
    `__post_init__` derives from others and refuses when given together with them (GRPO's generation_batch_size next
    to steps_per_generation): they are passed as None and derived again, to the same value.
    """
    own = {f.name for f in fields(target) if f.init}
    values = {f.name: getattr(config, f.name) for f in fields(config) if f.init}
    unknown = sorted(set(values) - own)
    if unknown:
        raise UnsupportedOptionError(
            f"args is a {type(config).__name__} with fields {target.__name__} does not have ({', '.join(unknown)}); "
            f"pass a {target.__name__} (or a subclass of it) so every option is checked")
    values.update(dict.fromkeys(rederived))
    with warnings.catch_warnings():  # deprecation warnings of the carried values were shown when `config` was built
        warnings.simplefilter("ignore", FutureWarning)
        return target(**values)
