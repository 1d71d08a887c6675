"""Lazy package faces: a module-level `__getattr__` that imports a public name's module on first use (PEP 562).

    _EXPORTS = {"ThunderSyncGRPOTrainer": ".trainer", "ThunderSyncGRPOConfig": ".config"}
    __getattr__ = lazy_attributes(__name__, _EXPORTS)

Importing a package then stays cheap: `trainers.grpo.config` alone does not load the trainer (or TRL's trainer).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """`__getattr__` for `package`: `exports` maps each public name to the module defining it (relative to
    `package` or absolute); any other name raises AttributeError as a plain module would."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
