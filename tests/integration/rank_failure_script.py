"""Run under `accelerate launch` (2 processes, one node or two): ThunderSync GRPO in which rank 1 fails in the
middle of its second logical batch, from inside its reward function (its other group still in flight). Launched by
test_rank_failure.py.

argv: output folder, tiny model folder, case — `raise` (the reward function raises), `kill` (the process is
SIGKILLed: no exception, no clean-up) or `hang` (the reward function never returns) — and `ddp_timeout` in seconds.
The failing rank writes the wall-clock time of its failure to `<output folder>/failed_at`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from transformers import AutoTokenizer

from benchmarks.parity import reward_len, run_trainer
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

out, model_path, case, ddp_timeout = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
rank = int(os.environ["RANK"])


def reward_fails_mid_batch(completion_ids, **kwargs) -> list[float]:
    """`reward_len`, except on rank 1 in the second batch."""
    state = kwargs.get("trainer_state")
    if rank == 1 and state is not None and state.global_step == 1:
        (out / "failed_at").write_text(repr(time.time()))
        if case == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if case == "hang":
            time.sleep(3600)
        raise RuntimeError(f"reward server unreachable on rank {rank}")
    return reward_len(completion_ids)


out.mkdir(parents=True, exist_ok=True)
run_trainer(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, out, AutoTokenizer.from_pretrained(model_path), model_path,
            rewards=(reward_fails_mid_batch,), max_steps=3, optim="sgd", ddp_timeout=ddp_timeout)
raise SystemExit(f"rank {rank}: training finished although rank 1 failed")
