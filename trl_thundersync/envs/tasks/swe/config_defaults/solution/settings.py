"""Client settings with documented defaults.

    timeout   seconds before a request is abandoned         default 30
    retries   attempts after the first failure              default 3
    tags      labels attached to every request              default: none
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Settings:
    timeout: float = 30
    retries: int = 3
    tags: list[str] = field(default_factory=list)


def load_settings(values: dict[str, str], tags: list[str] | None = None) -> Settings:
    """Build settings from string values (e.g. from environment variables), with defaults for missing keys."""
    settings = Settings()
    if "timeout" in values:
        settings.timeout = float(values["timeout"])
    if "retries" in values:
        settings.retries = int(values["retries"])
    settings.tags = list(tags or []) + [t for t in values.get("tags", "").split(",") if t]
    return settings
