"""trl_thundersync: zero-staleness gradient streaming for TRL (ThunderSyncRL, arXiv 2610.05935).

    from trl_thundersync import ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig
    from trl_thundersync import ThunderSyncGKDTrainer, ThunderSyncGKDConfig   # on-policy distillation per turn

Public names import lazily so `import trl_thundersync` stays cheap and optional dependencies load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .lazy import lazy_attributes

__version__ = "0.1.0"

_LAZY = {
    "ThunderSyncGRPOTrainer": "trl_thundersync.trainers.grpo",
    "ThunderSyncGRPOConfig": "trl_thundersync.trainers.grpo",
    "ThunderSyncGKDTrainer": "trl_thundersync.trainers.gkd",
    "ThunderSyncGKDConfig": "trl_thundersync.trainers.gkd",
    "LocalProcessEngine": "trl_thundersync.rollout.local",
    "RolloutEngine": "trl_thundersync.rollout.engine",
}

__all__ = [*_LAZY, "errors", "types", "__version__"]

if TYPE_CHECKING:
    from .rollout.engine import RolloutEngine as RolloutEngine
    from .rollout.local import LocalProcessEngine as LocalProcessEngine
    from .trainers.gkd import ThunderSyncGKDConfig as ThunderSyncGKDConfig
    from .trainers.gkd import ThunderSyncGKDTrainer as ThunderSyncGKDTrainer
    from .trainers.grpo import ThunderSyncGRPOConfig as ThunderSyncGRPOConfig
    from .trainers.grpo import ThunderSyncGRPOTrainer as ThunderSyncGRPOTrainer


_public = lazy_attributes(__name__, _LAZY)


def __getattr__(name: str):
    if name in ("errors", "types"):
        return importlib.import_module(f"trl_thundersync.{name}")
    return _public(name)
