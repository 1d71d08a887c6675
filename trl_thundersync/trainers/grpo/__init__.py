"""GRPO with gradient streaming: `ThunderSyncGRPOTrainer` / `ThunderSyncGRPOConfig`, drop-ins for `trl.GRPOTrainer`
/ `trl.GRPOConfig`.

    from trl_thundersync.trainers.grpo import ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig

`trainer.py` wires the parts; beside it: `config.py` and `checks.py` (what is refused), `settings.py` (the run's
frozen `GRPOSettings`), `backward.py` (the per-source passes), `batch.py` (the `OpenBatch` record, the barrier's
collectives), `entropy.py`, `iterations.py` (num_iterations > 1), `metrics.py`, `rewards.py`, `progress.py`. The
names import lazily, so importing `config` alone does not load the trainer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_attributes

_EXPORTS = {"ThunderSyncGRPOTrainer": ".trainer", "ThunderSyncGRPOConfig": ".config"}

__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .config import ThunderSyncGRPOConfig as ThunderSyncGRPOConfig
    from .trainer import ThunderSyncGRPOTrainer as ThunderSyncGRPOTrainer


__getattr__ = lazy_attributes(__name__, _EXPORTS)
