"""Stock `GKDTrainer` and `ThunderSyncGKDTrainer` on two CPU processes (DDP over gloo) on identical completions:
`torchrun --nproc_per_node 2 gkd_stock_ddp_script.py OUT MODEL TEACHER`, launched by test_gkd_vs_stock_trl_ddp.py.

For every case of `DDP_CASES` (the one-process cases of test_gkd_vs_stock_trl.py), three runs as there: stock TRL,
stock TRL with each process's batch rows reversed (the floor), and ThunderSync with its defaults (stock GKD's
normalization: each process divides by the gathered `num_items_in_batch` and DDP averages, 1/2 of the one-process
step, as stock TRL). Rank 0 saves every run's clipped directions, update and logs to OUT/results.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from tests.integration.test_gkd_vs_stock_trl import CASES, stock_run, thundersync_run

DDP_CASES = ("beta0.5", "accumulation", "clipping", "mixed_lmbda", "mixed_lmbda_accumulation_seed3", "adamw_3steps")

out, student, teacher = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
tokenizer = AutoTokenizer.from_pretrained(student)
results = {}
for case in DDP_CASES:
    runs = {"stock": stock_run(out / case, "stock", tokenizer, student, teacher, **CASES[case]),
            "floor": stock_run(out / case, "floor", tokenizer, student, teacher, permuted=True, **CASES[case]),
            "ts": thundersync_run(out / case, "ts", tokenizer, student, teacher, **CASES[case])}
    results[case] = {name: {"directions": run.directions, "update": run.update, "logs": run.logs}
                     for name, run in runs.items()}
if int(os.environ.get("RANK", "0")) == 0:
    torch.save(results, out / "results.pt")
torch.distributed.barrier()
torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # as ddp_parity_script.py: the results are saved and every rank passed the barrier
