"""What `ThunderSyncGKDTrainer` covers under the sharded engines (DeepSpeed ZeRO-1/2/3, FSDP2), refused by field.

Covered: ZeRO-1/2, on-policy distillation (lmbda=1, no seq_kd) with a SERVED teacher (`teacher_server_url`): every
per-turn forward and backward runs on the engine's replicated module, the teacher is an HTTP call, and the direction
reaches the engine at the barrier as for GRPO — so nothing in a turn is a collective that ranks would enter at their
own time. Measured equal to one process on the same global batch under ZeRO-2 (tests/integration/test_gkd_engines.py;
ZeRO-1 is the same placement class).

Not covered, and why:
- ZeRO-3 and FSDP2 (the replica gathered once per batch): the first parity run failed in the rollout engine's start
  under the sharded policy; not debugged yet;
- a local `teacher_model`: TRL prepares it through the engine (a ZeRO-3 / FSDP2 teacher is partitioned, so its
  forward per turn is a collective entered at each rank's own time: a hang), and no parity run covers a
  teacher engine under ZeRO-1/2 either;
- lmbda < 1 or seq_kd: the off-policy micro-steps run TRL's own loss through `accelerator.backward`, i.e. through
  the engine's backward and step, beside the placement's hand-over; that mix is not covered by a parity run.
"""

from __future__ import annotations

from typing import Any

from ...errors import UnsupportedOptionError


def is_gkd(args: Any) -> bool:
    from ..gkd_config import ThunderSyncGKDConfig

    return isinstance(args, ThunderSyncGKDConfig)


def check_gkd_engine(engine: str, args: Any) -> None:
    """Refuse, at construction, the GKD settings the sharded placements do not cover (`engine` names the engine and
    stage in the message, e.g. "DeepSpeed ZeRO-3" or "FSDP2 (fully_shard)")."""
    if not is_gkd(args):
        return
    if "ZeRO-3" in engine or "FSDP" in engine:
        raise UnsupportedOptionError(
            f"{engine}: ThunderSyncGKDTrainer is not covered under sharded parameters yet (its parity run against one "
            "process does not pass); use DeepSpeed ZeRO-1/2 with a served teacher, DDP or a single process")
    if args.teacher_server_url is None:
        raise UnsupportedOptionError(
            f"{engine}: ThunderSyncGKDTrainer with a local teacher_model is not covered: the engine would prepare the "
            "teacher (partitioned under ZeRO-3 / FSDP2, so each per-turn teacher forward is a collective that ranks "
            "enter at their own times). Serve the teacher (teacher_server_url, e.g. `trl_thundersync.serve`'s "
            "embedded server or vLLM) or train under DDP")
    if args.lmbda < 1.0 or args.seq_kd:
        raise UnsupportedOptionError(
            f"{engine}: ThunderSyncGKDTrainer with lmbda={args.lmbda}, seq_kd={args.seq_kd}: the off-policy "
            "micro-steps would run TRL's own loss through the engine's backward beside ThunderSync's hand-over, which "
            "is not covered; use lmbda=1.0 and seq_kd=False, or DDP")
