"""On-policy distillation with per-turn streaming: `ThunderSyncGKDTrainer` / `ThunderSyncGKDConfig`, drop-ins for
TRL's GKD trainer (`trl.experimental.gkd`) with the paper's turn-level OPD objective.

    from trl_thundersync.trainers.gkd import ThunderSyncGKDTrainer, ThunderSyncGKDConfig

`trainer.py` wires the parts; beside it: `config.py`, `checks.py` (what is refused) and `rollout.py` (its rollout
engine). The names import lazily, so importing `config` alone does not load the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_attributes

_EXPORTS = {"ThunderSyncGKDTrainer": ".trainer", "ThunderSyncGKDConfig": ".config"}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .config import ThunderSyncGKDConfig as ThunderSyncGKDConfig
    from .trainer import ThunderSyncGKDTrainer as ThunderSyncGKDTrainer


__getattr__ = lazy_attributes(__name__, _EXPORTS)
