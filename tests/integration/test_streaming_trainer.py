"""Trainer-level behaviour: order independence, schedules, LoRA, checkpoint/resume, drop-in migration."""

from __future__ import annotations

import random

import pytest
import torch

from benchmarks.parity import (
    SHARED_PREFIX,
    StopAt,
    cpu_config,
    load_model,
    prompt_dataset,
    reward_len,
    scripted_rollout_func,
)
from tests.fixtures.exactness import rel, run
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = pytest.mark.slow
TOL = 1e-5


class ShuffledEngine:
    """Wraps an engine and delivers its trajectories in a seeded random order (a different completion order)."""

    def __init__(self, inner, seed):
        self.inner, self.rng = inner, random.Random(seed)
        self.orders = []

    def start_batch(self, requests, policy_version):
        self.inner.start_batch(requests, policy_version)

    def results(self):
        items = list(self.inner.results())
        self.rng.shuffle(items)
        self.orders.append([r.index for r in items])
        yield from items

    def publish(self, model, policy_version):
        return self.inner.publish(model, policy_version)

    def close(self):
        self.inner.close()


@pytest.mark.parametrize("case", [dict(), dict(loss_type="grpo", beta=0.1), dict(gradient_accumulation_steps=2,
                                  per_device_train_batch_size=2, loss_type="bnpo"),
                                  dict(SHARED_PREFIX), dict(loss_type="grpo", beta=0.1, **SHARED_PREFIX)])
def test_update_is_independent_of_completion_order(case, tmp_path, tokenizer, tiny_model_path):
    overrides = dict(case, max_steps=2, max_grad_norm=0.0, optim="sgd")
    base_dirs, base, _ = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "base", tokenizer,
                             tiny_model_path, **overrides)
    orders = []
    for seed in (1, 2, 3):
        engines = []

        def wrap(engine, seed=seed, engines=engines):
            engines.append(ShuffledEngine(engine, seed))
            return engines[-1]

        dirs, params, _ = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / str(seed), tokenizer,
                              tiny_model_path, wrap_engine=wrap, **overrides)
        orders.append(engines[0].orders[0])
        assert rel(params, base) <= TOL
        for a, b in zip(dirs, base_dirs, strict=True):
            assert rel(a, b) <= TOL
    assert len({tuple(o) for o in orders}) > 1, "the test must actually exercise different orders"
    assert any(o != sorted(o) for o in orders)


@pytest.mark.parametrize("batched", [False, True], ids=["one_by_one", "batched_groups"])
def test_sync_and_thundersync_schedules_give_the_same_parameters(batched, tmp_path, tokenizer, tiny_model_path):
    """The same code path, only the release time differs: bit-identical with members learned one by one; with
    `batch_group_members` the sync schedule learns each whole group as one padded pass, the same up to rounding."""
    results = {}
    for schedule in ("sync", "thundersync"):
        _, params, trainer = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / schedule, tokenizer,
                                 tiny_model_path, schedule=schedule, max_steps=3, optim="sgd", beta=0.05,
                                 batch_group_members=batched)
        results[schedule] = params
        totals, timing = trainer.last_batch
        assert sorted(timing.arrival_order) == [0, 1, 2, 3]
        if schedule == "sync":
            sizes = {w.batched for w in totals.work if w.kind == "trajectory"}
            assert sizes == {trainer.num_generations if batched else 1}
    if batched:
        assert rel(results["sync"], results["thundersync"]) <= TOL
    else:
        assert torch.equal(results["sync"], results["thundersync"])


@pytest.mark.parametrize("release, buffers", [("reward", 0), ("content", 2)])
def test_admission_cap_bounds_open_groups_and_keeps_the_update(release, buffers, tmp_path, tokenizer,
                                                               tiny_model_path):
    # (members one by one: a group batched at once holds no statistics buffers, so the uncapped run's peak would not
    # show what the cap bounds)
    caps = dict(max_buffered_trajectories=buffers) if buffers else {}
    _, free, t_free = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "free", tokenizer,
                          tiny_model_path, max_steps=1, optim="sgd", per_device_train_batch_size=8,
                          wrap_engine=lambda e: ShuffledEngine(e, 7), release=release, batch_group_members=False)
    _, capped, t_cap = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "cap", tokenizer,
                           tiny_model_path, max_steps=1, optim="sgd", per_device_train_batch_size=8,
                           max_open_groups=1, wrap_engine=lambda e: ShuffledEngine(e, 7), release=release,
                           batch_group_members=False, **caps)
    assert rel(capped, free) <= TOL
    num_params = sum(p.numel() for p in t_cap.model.parameters() if p.requires_grad)
    peak_free, peak_cap = t_free.last_batch[0].peak_stats_bytes, t_cap.last_batch[0].peak_stats_bytes
    assert peak_cap <= 4 * (2 * 1 + 1) * num_params + 4 * buffers * num_params  # groups + batch buffer + H_i buffers
    assert peak_cap < peak_free
    log = next(h for h in t_cap.state.log_history if "thundersync/stats_bound_mb" in h)
    assert log["thundersync/stats_bound_mb"] * 2**20 == pytest.approx(4 * (3 + buffers) * num_params)
    if buffers:
        assert t_cap.last_batch[0].peak_held <= buffers and log["thundersync/buffered_peak"] <= buffers


@pytest.mark.parametrize("release", ["reward", "content"])
def test_shared_prefix_under_the_admission_cap_keeps_the_update(release, tmp_path, tokenizer, tiny_model_path):
    """max_open_groups=1 also caps the open prefixes: under content release later groups' members run full passes
    (their groups decline a prefix); the update is the uncapped full passes'."""
    common = dict(max_steps=1, optim="sgd", per_device_train_batch_size=8, release=release,
                  wrap_engine=lambda e: ShuffledEngine(e, 7))
    _, free, _ = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "free", tokenizer, tiny_model_path,
                     shared_prefix=False, **common)
    _, capped, t_cap = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "cap", tokenizer,
                           tiny_model_path, max_open_groups=1, **SHARED_PREFIX, **common)
    assert rel(capped, free) <= TOL
    work = t_cap.last_batch[0].work
    opened = [w for w in work if w.kind == "prefix_forward"]
    assert opened and len(opened) == len([w for w in work if w.kind == "prefix_backward"])
    live = 0
    for w in sorted(opened + [w for w in work if w.kind == "prefix_backward"], key=lambda w: w.start):
        live += 1 if w.kind == "prefix_forward" else -1
        assert live <= 1  # never more open prefixes than max_open_groups


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_lora_trains_adapter_only_and_matches_trl(shared_prefix, tmp_path, tokenizer, tiny_model_path):
    """With the shared prefix, the KL reference's prefix is the policy's with its adapter disabled."""
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    overrides = dict(max_steps=2, optim="sgd", beta=0.1)
    ref_dirs, ref, _ = run(GRPOTrainer, GRPOConfig, tmp_path / "trl", tokenizer, tiny_model_path, peft_config=lora,
                           **overrides)
    got_dirs, got, trainer = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "ts", tokenizer,
                                 tiny_model_path, peft_config=lora, **overrides,
                                 **(SHARED_PREFIX if shared_prefix else dict(shared_prefix=False)))
    kinds = {w.kind for w in trainer.last_batch[0].work}
    assert ("prefix_forward" in kinds) == shared_prefix
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    full = sum(p.numel() for p in trainer.model.parameters())
    assert trainer.last_batch[1] is not None and got.numel() < full / 10
    assert rel(got, ref) <= TOL
    for a, b in zip(got_dirs, ref_dirs, strict=True):
        assert rel(a, b) <= TOL



def test_resume_from_checkpoint_reaches_the_same_parameters(tmp_path, tokenizer, tiny_model_path):
    common = dict(max_steps=4, optim="adamw_torch", learning_rate=1e-3, save_strategy="steps", save_steps=2)
    _, straight, _ = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path / "straight", tokenizer,
                         tiny_model_path, **common)

    out = tmp_path / "resumed"
    args = cpu_config(ThunderSyncGRPOConfig, out, **common)
    first = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len], args=args,
                                   train_dataset=prompt_dataset(), processing_class=tokenizer,
                                   rollout_func=scripted_rollout_func(tokenizer), callbacks=[StopAt(2)])
    first.train()  # interrupted after step 2 (same max_steps, so the same learning-rate schedule)
    assert (out / "checkpoint-2").is_dir()
    second = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                                    args=cpu_config(ThunderSyncGRPOConfig, out, **common),
                                    train_dataset=prompt_dataset(), processing_class=tokenizer,
                                    rollout_func=scripted_rollout_func(tokenizer))
    second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert second.state.global_step == 4 and second.policy_version == 4
    resumed = torch.cat([p.detach().reshape(-1) for p in second.model.parameters()])
    assert rel(resumed, straight) <= TOL


def test_a_trl_script_runs_after_swapping_the_two_names(tmp_path, tokenizer, tiny_model_path):
    """The migration is a rename: same keyword arguments, same config fields, same outputs."""
    import inspect

    from trl import GRPOConfig, GRPOTrainer

    assert list(inspect.signature(ThunderSyncGRPOTrainer.__init__).parameters) == list(
        inspect.signature(GRPOTrainer.__init__).parameters)
    assert issubclass(ThunderSyncGRPOTrainer, GRPOTrainer) and issubclass(ThunderSyncGRPOConfig, GRPOConfig)
    script = f'''
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

def reward_num_unique_chars(completions, **kwargs):
    return [float(len(set(c))) for c in completions]

dataset = Dataset.from_dict({{"prompt": ["2 + 2 =", "The sea is", "Count to three:", "def add(a, b):"]}})
args = GRPOConfig(output_dir={str(tmp_path / "script")!r}, use_cpu=True, bf16=False, report_to="none",
                  per_device_train_batch_size=4, num_generations=2, max_completion_length=6, max_steps=2,
                  gradient_checkpointing=False, disable_tqdm=True, logging_steps=1)
trainer = GRPOTrainer(model={tiny_model_path!r}, reward_funcs=reward_num_unique_chars, args=args,
                      train_dataset=dataset)
trainer.train()
print("STEPS", trainer.state.global_step)
'''
    swapped = script.replace("from trl import GRPOConfig, GRPOTrainer",
                             "from trl_thundersync import ThunderSyncGRPOConfig as GRPOConfig, "
                             "ThunderSyncGRPOTrainer as GRPOTrainer")
    import subprocess
    import sys

    for text in (script, swapped):
        done = subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "STEPS 2" in done.stdout
