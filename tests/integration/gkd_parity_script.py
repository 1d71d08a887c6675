"""ThunderSyncGKDTrainer on one process or under `torchrun --nproc_per_node 2` (DDP over gloo), on the same global
batches: `python gkd_parity_script.py OUT MODEL TEACHER` is the one-process reference, the torchrun launch the run
under test; launched by test_gkd_distributed.py, which compares the two `results.pt`.

Parity cases (3 optimizer steps, global batch of 4 rows, each process streams its share). The generalized-JSD cases
use `on_policy_normalizer="scored_tokens"` (TRL's DistillationTrainer convention: the one-process step on any number
of processes); stock GKD's default normalization gives 1/num_processes of it under DDP, as stock TRL does, and is
compared with stock GKDTrainer on two processes by test_gkd_vs_stock_trl_ddp.py:
  plain_gjsd       sampled by the local engine (a thread) from the student, generalized JSD vs a local teacher,
                   shuffled rows, TRL's default clipping (max_grad_norm=1.0)
  plain_opd_ga2    the same with OPD, per-device batches of 2 // world rows × gradient_accumulation_steps=2
  agent_opd        multi-turn tool episodes (`CounterEnv`) of 2–4 turns by prompt (unequal tokens per process)
  agent_gjsd       the same with the generalized JSD
  mixed_lmbda      lmbda=0.5: TRL's draw decides per step between a streamed on-policy batch and TRL's own
                   off-policy step (DDP's backward); every process takes the same branch
  rank1_empty      in-order rows, every completion of a row the second process would hold is empty: that process
                   streams zero scored tokens and its share is zero, the step still the global batch's
  server_opd       OPD over HTTP: the student samples from one embedded rollout server that process 0 starts and
                   alone publishes to, the teacher is the served one at $TS_TEST_TEACHER_URL (started by the test,
                   read-only, shared by every process)
Failure cases (two processes only; each process records the error it raised):
  teacher_fails    process 1's teacher raises at its third turn (step 2): process 1 re-raises it, process 0 raises
                   PeerProcessError naming it, without waiting
  all_empty        every completion is empty: N_k = 0 on every process → NoScoredTokensError on both
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from benchmarks.parity import CaptureGrads, load_model
from benchmarks.scripted import ScriptedTurnGenerator, tool_call_text
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer
from trl_thundersync.errors import TeacherScoringError
from trl_thundersync.trainers.gkd_rollout import agent_engine

out, model_path, teacher_path = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
tokenizer = AutoTokenizer.from_pretrained(model_path)


def messages(n=12):
    return Dataset.from_dict({"messages": [[{"role": "user", "content": f"What is {i} + {i}?"},
                                            {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]
                                           for i in range(n)]})


def prompts(n=12):
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Reach {i}."}] for i in range(n)],
                              "target": list(range(n))})


class CounterEnv:
    def reset(self, **row) -> str | None:
        self.count = 0
        return f" Target: {row['target']}."

    def increment(self, amount: int) -> str:
        """Add an amount to the counter.

        Args:
            amount: how much to add
        """
        self.count += amount
        return f"counter={self.count}"


def count_script(index: int, turn: int, context: str) -> str:
    """1 + target % 3 tool calls, then the answer: by the prompt's content, never by the process-local index."""
    target = int(re.search(r"Reach (\d+)\.", context).group(1))
    return tool_call_text("increment", {"amount": target + turn}) if turn < 1 + target % 3 else "Done."


def row_number(text: str) -> int:
    return int(re.search(r"What is (\d+)", text).group(1))


def answer_script(index: int, turn: int, context: str) -> str:
    return f"It is {row_number(context)}."


class EmptyRows(ScriptedTurnGenerator):
    """Single-turn scripted answers; rows whose number `empty(n)` selects get an empty completion (zero tokens)."""

    def __init__(self, empty) -> None:
        super().__init__(tokenizer, answer_script)
        self.empty = empty

    def _act(self, request, key, max_new_tokens, version):
        rollout = super()._act(request, key, max_new_tokens, version)
        n = row_number(self.tokenizer.decode(list(request.prompt_ids)))
        return dataclasses.replace(rollout, completion_ids=(), sampling_logprobs=()) if self.empty(n) else rollout


class FailingTeacher:
    """The trainer's teacher, raising at its `fail_at`-th turn (a teacher that died mid-batch)."""

    full_vocabulary = True

    def __init__(self, inner, fail_at: int) -> None:
        self.inner, self.fail_at, self.calls = inner, fail_at, 0

    def score(self, context_ids, action_ids):
        self.calls += 1
        if self.calls >= self.fail_at:
            raise TeacherScoringError(f"teacher of process {rank} died at its turn {self.calls}")
        return self.inner.score(context_ids, action_ids)

    def close(self) -> None:
        self.inner.close()


def config(name: str, **overrides) -> ThunderSyncGKDConfig:
    base = dict(output_dir=str(out / name), use_cpu=True, bf16=False, gradient_checkpointing=False,
                report_to="none", per_device_train_batch_size=4 // world, max_steps=3, max_new_tokens=10, lmbda=1.0,
                logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, learning_rate=1e-2, optim="sgd",
                max_grad_norm=1e9, rollout_engine="local_thread", beta=0.3)
    base.update(overrides)
    return ThunderSyncGKDConfig(**base)


CASES = {
    "plain_gjsd": dict(objective="gjsd", max_grad_norm=1.0, on_policy_normalizer="scored_tokens"),
    "plain_opd_ga2": dict(objective="opd", per_device_train_batch_size=2 // world, gradient_accumulation_steps=2),
    "agent_opd": dict(objective="opd", agent_max_turns=4, max_new_tokens=64),
    "agent_gjsd": dict(objective="gjsd", agent_max_turns=4, max_new_tokens=64),
    "rank1_empty": dict(objective="opd", train_sampling_strategy="sequential"),
    "server_opd": dict(objective="opd", rollout_engine="embedded_server", rollout_num_servers=1,
                       rollout_max_in_flight=4, teacher_server_url=os.environ.get("TS_TEST_TEACHER_URL")),
    "mixed_lmbda": dict(objective="gjsd", lmbda=0.5, on_policy_normalizer="scored_tokens"),
    "teacher_fails": dict(objective="opd"),
    "all_empty": dict(objective="opd"),
}
LOGGED = ("loss", "thundersync/on_policy", "thundersync/scored_tokens", "thundersync/turns", "opd/reverse_kl",
          "completions/mean_length", "agent/turns_mean", "tools/call_frequency")


def run(case: str) -> dict:
    overrides = dict(CASES[case])
    agentic = case.startswith("agent_")
    capture = CaptureGrads()
    served_teacher = case.startswith("server_")
    trainer = ThunderSyncGKDTrainer(model=load_model(model_path),
                                    teacher_model=None if served_teacher else load_model(teacher_path),
                                    args=config(case, **overrides), train_dataset=prompts() if agentic else messages(),
                                    processing_class=tokenizer, callbacks=[capture],
                                    environment_factory=CounterEnv if agentic else None)
    if agentic:
        trainer._engine = agent_engine(ScriptedTurnGenerator(tokenizer, count_script), trainer.args,
                                       tokenizer=trainer.processing_class, tools=None, environment_factory=CounterEnv,
                                       on_turn=trainer._router)
    elif case == "rank1_empty":  # in order: the second half of every global batch of 4 (process 1's rows) is empty
        trainer.use_turn_generator(EmptyRows(lambda n: n % 4 >= 2))
    elif case == "all_empty":
        trainer.use_turn_generator(EmptyRows(lambda n: True))
    elif case == "teacher_fails":
        trainer.use_turn_generator(EmptyRows(lambda n: False))
        if rank == 1:
            trainer._teacher = FailingTeacher(trainer._teacher, fail_at=3)
    engine = trainer._rollout_engine() if case == "server_opd" else None  # built at once: every process enters
    started = time.perf_counter()
    try:
        trainer.train()
    except Exception as exc:  # the failure cases: what this process raised, and how long it took to raise it
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.perf_counter() - started,
                "steps": trainer.state.global_step}
    logs = [{k: h[k] for k in LOGGED if k in h} for h in trainer.state.log_history if "loss" in h]
    final = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters() if p.requires_grad])
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters() if p.requires_grad])
    record = {"directions": capture.directions, "params": final, "update": final - initial, "logs": logs,
              "policy_version": trainer.policy_version,
              "local_tokens": trainer.last_batch[0].scored_tokens if trainer.last_batch else 0}
    if engine is not None:  # who owned the server, who published, what each process sampled (the engine is closed)
        record.update(urls=engine.base_urls, owns_servers=engine.supervisor is not None,
                      has_publisher=engine._publisher is not None, trajectories=engine.stats().trajectories)
    return record


only = os.environ.get("TS_TEST_CASES")  # a comma-separated subset, for runs by hand
cases = [c for c in (only.split(",") if only else CASES) if world > 1 or c not in ("teacher_fails", "all_empty")]
results = {}
for case in cases:
    started = time.perf_counter()
    mine = run(case)
    mine["wall_seconds"] = time.perf_counter() - started  # the case's cost, for the CI budget
    if world > 1:  # every process's record: who raised what, each process's own token count
        gathered = [None] * world
        torch.distributed.all_gather_object(gathered, {k: v for k, v in mine.items()
                                                       if k not in ("directions", "params", "update")})
        mine["ranks"] = gathered
    results[case] = mine
if rank == 0:
    torch.save(results, out / "results.pt")
if world > 1:
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)  # as ddp_parity_script.py: the results are saved and every rank passed the barrier
