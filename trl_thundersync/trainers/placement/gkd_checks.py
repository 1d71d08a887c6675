"""What `ThunderSyncGKDTrainer` covers under the sharded engines (DeepSpeed ZeRO-1/2/3, FSDP2), refused by field.

Covered, on the engines' placements (each measured equal to one process on the same global batch:
tests/integration/test_gkd_engines.py; ZeRO-1 is ZeRO-2's placement class):
- on-policy steps: every per-turn forward and backward runs on the engine's replicated module (ZeRO-1/2) or on the
  unsharded replica gathered once per batch (ZeRO-3, FSDP2), the direction reaches the engine at the barrier as for
  GRPO, so nothing in a turn is a collective that ranks would enter at their own time;
- the teacher: served (`teacher_server_url`, an HTTP call) or a local `teacher_model`, which TRL prepares through the
  engine (ZeRO-1/2: a stage-0 inference engine, local; ZeRO-3 / FSDP2: partitioned, so the placement's
  `reference_module` gathers it once into a plain copy per rank, and the per-turn teacher forward is local);
- lmbda < 1 and seq_kd: TRL's own off-policy steps run through the engine's backward and step (every process takes
  the same branch: the draw is process 0's), and `note_engine_step` marks the replica stale after them.

Not covered: lmbda < 1 with gradient accumulation (a window mixing both kinds of micro-steps is accumulated by the
replicated placement only: one process and DDP).
"""

from __future__ import annotations

from typing import Any

from ...errors import UnsupportedOptionError


def is_gkd(args: Any) -> bool:
    from ..gkd.config import ThunderSyncGKDConfig

    return isinstance(args, ThunderSyncGKDConfig)


def check_gkd_engine(engine: str, args: Any) -> None:
    """Refuse, at construction, the GKD settings the sharded placements do not cover (`engine` names the engine and
    stage in the message, e.g. "DeepSpeed ZeRO-3" or "FSDP2 (fully_shard)")."""
    if not is_gkd(args):
        return
    if args.lmbda < 1.0 and args.gradient_accumulation_steps > 1:
        raise UnsupportedOptionError(
            f"{engine}: ThunderSyncGKDTrainer with lmbda={args.lmbda} and gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}: a window mixing TRL's off-policy micro-steps (through the engine's "
            "backward) with streamed on-policy ones would need the engine to accumulate both, which only one process "
            "and DDP do here; use gradient_accumulation_steps=1 (raise per_device_train_batch_size) or DDP")
