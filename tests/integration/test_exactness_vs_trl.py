"""FP32 exactness against stock `trl.GRPOTrainer` on identical batches (ARCHITECTURE invariant 3).

Both trainers get the same model, data order, scripted rollouts (via TRL's `rollout_func`) and rewards; we compare
the batch direction TRL's loop clips and steps with (captured right before `optimizer.step()`), and the parameters
after three optimizer steps with clipping on.
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import PARITY_CASES, SHARED_PREFIX, load_model, reward_len, reward_parity
from tests.fixtures.exactness import rel, run
from tests.fixtures.learner_work import assert_content_release
from tests.fixtures.timing_stress import delayed
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = [pytest.mark.slow, pytest.mark.exactness]  # the exactness layer (scripts/kernel_passes.sh)
TOL = 1e-5


CASES = PARITY_CASES


# Release points × reward scopes: the paper's reward release with per-trajectory calls, and content release (every
# H_i computed before any reward, bound when TRL's own batch call returns).
# Each also with the shared-prefix backward (the group's prompt forwarded and back-propagated once).
RELEASES = {"reward": dict(release="reward"), "content_batch_scope": dict(release="content", reward_scope="batch"),
            "reward_shared_prefix": dict(release="reward", **SHARED_PREFIX),
            "content_batch_scope_shared_prefix": dict(release="content", reward_scope="batch", **SHARED_PREFIX),
            # the sync schedule hands the learner whole groups: each is one padded pass (batch_group_members), as full
            # sequences, or over its prefix
            "sync_batched": dict(schedule="sync"), "sync_batched_shared_prefix": dict(schedule="sync", **SHARED_PREFIX)}
# option sets whose groups are not batched (each member its own pass): normalize_then_sum's per-function statistics
BATCH_REFUSED = {"normalize_then_sum"}
# option sets the shared prefix refuses (full passes, the reason logged): it must not run there
PREFIX_REFUSED = {"gradient_checkpointing", "normalize_then_sum"}


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_batch_direction_matches_trl(case, release, tmp_path, tokenizer, tiny_model_path):
    check_batch_direction(case, release, tmp_path, tokenizer, tiny_model_path)


@pytest.mark.parametrize("case", ["mask_truncated", "dapo"])
def test_content_release_whose_members_all_wait_with_their_rewards_matches_trl(case, tmp_path, tokenizer,
                                                                               tiny_model_path, monkeypatch):
    """The learner starts late (as on a loaded machine, CI's once): every trajectory's content is still waiting when
    its batch-scoped reward comes, so each group is one padded pass at its reward and no content pass runs."""
    from trl_thundersync.streaming import pipeline

    # (1 s: the scripted rollouts and TRL's batch reward call finish well within it)
    monkeypatch.setattr(pipeline, "drain", delayed(pipeline.drain, 1.0))
    work = check_batch_direction(case, "content_batch_scope_shared_prefix", tmp_path, tokenizer, tiny_model_path)
    assert not {"content", "bind"} & {w.kind for w in work}


def check_batch_direction(case, release, tmp_path, tokenizer, tiny_model_path):
    """One step of stock TRL and of ours on identical batches: the same clipped direction and reported loss; the
    learner work the release point promises. Returns our step's work items."""
    overrides = dict(CASES[case], max_steps=1, max_grad_norm=0.0)
    rewards = (reward_len, reward_parity) if "reward_weights" in overrides else (reward_len,)
    ref, _, ref_trainer = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, rewards=rewards,
                              **overrides)
    got, _, trainer = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path,
                          rewards=rewards, **overrides, **RELEASES[release])
    work = trainer.last_batch[0].work
    kinds = {w.kind for w in work}
    shared = release.endswith("shared_prefix") and case not in PREFIX_REFUSED
    if release.startswith("content"):
        assert_content_release(work, case)
    else:
        assert "content" not in kinds
    assert ("prefix_forward" in kinds and "prefix_backward" in kinds) == shared, kinds
    if release.startswith("sync_batched") and case not in BATCH_REFUSED:  # each group: one pass of its learnable rows
        items = [w for w in work if w.kind == "trajectory"]
        # (0: a member with nothing to learn, not forwarded)
        assert all(len({w.batched for w in items if w.group == g} - {0}) <= 1 for g in {w.group for w in items}), case
        assert case == "mask_truncated" or max(w.batched for w in items) > 1, case  # (there: one learnable row)
    assert len(ref) == len(got) == 1
    assert ref[0].norm() > 0
    assert rel(got[0], ref[0]) <= TOL, f"{case}: relative error {rel(got[0], ref[0]):.2e}"
    # the reported loss is TRL's value at ratio 1 (sapo's 2/τ_±, cispo's and vespo's log π), not the gradient's sign
    got_loss, ref_loss = trainer.state.log_history[0]["loss"], ref_trainer.state.log_history[0]["loss"]
    assert got_loss == pytest.approx(ref_loss, rel=TOL, abs=1e-7), f"{case}: loss {got_loss} vs TRL's {ref_loss}"
    return work


@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize("optim", ["adamw_torch", "sgd"])
@pytest.mark.parametrize("case", ["dapo", "ga2_bnpo_beta", "multi_reward_weights_none"])
def test_parameters_after_three_steps_match_trl(case, optim, release, tmp_path, tokenizer, tiny_model_path):
    # AdamW's first update is ~lr·g/|g|: rounding-level noise on near-zero gradient coordinates becomes lr-sized
    # parameter noise, so AdamW runs at a realistic RL learning rate; SGD (linear in g) runs at 1e-2 and is also
    # held to the stricter check on the update Δθ itself and on every step's direction.
    lr = 1e-4 if optim == "adamw_torch" else 1e-2
    overrides = dict(CASES[case], max_steps=3, max_grad_norm=0.5, optim=optim, learning_rate=lr)
    rewards = (reward_len, reward_parity) if "reward_weights" in overrides else (reward_len,)
    ref_dirs, ref, _ = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, rewards=rewards, **overrides)
    got_dirs, got, _ = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path,
                           rewards=rewards, **overrides, **RELEASES[release])
    assert len(ref_dirs) == len(got_dirs) == 3
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    assert (ref - initial).norm() > 0, "the reference run did not move the parameters"
    assert rel(got, ref) <= TOL
    if optim == "sgd":
        assert rel(got - initial, ref - initial) <= TOL
    compared = got_dirs if optim == "sgd" else got_dirs[:1]
    for a, b in zip(compared, ref_dirs[: len(compared)], strict=True):
        assert rel(a, b) <= TOL


async def reward_async_len(completion_ids, **kwargs):
    return [float(len(c) % 3) for c in completion_ids]


def test_async_reward_function_and_reward_model_match_trl(tmp_path, tokenizer, tiny_model_path):
    """Async reward functions run on TRL's event loop; a reward model scores the rendered text, as in TRL."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    reward_model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    reward_model.config.pad_token_id = tokenizer.pad_token_id
    rewards = (reward_async_len, reward_model)
    overrides = dict(max_steps=1, max_grad_norm=0.0, reward_weights=[1.0, 10.0])
    ref, _, ref_trainer = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, rewards=rewards,
                              reward_processing_classes=[None, tokenizer], **overrides)
    got, _, trainer = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path,
                          rewards=rewards, reward_processing_classes=[None, tokenizer], **overrides)
    assert rel(got[0], ref[0]) <= TOL
    model_rewards = trainer._logs["rewards"][trainer.reward_func_names[1]]
    assert len(set(round(r, 6) for r in model_rewards)) > 1  # the reward model really scored each completion


def test_sync_ref_model_matches_trl(tmp_path, tokenizer, tiny_model_path):
    """TRL's SyncRefModelCallback mixes the policy into the reference model after every `ref_model_sync_steps`
    steps; the streamed β·KL term reads that same `trainer.ref_model`, so steps 2–3 see the mixed reference."""
    overrides = dict(beta=0.1, sync_ref_model=True, ref_model_sync_steps=1, ref_model_mixup_alpha=0.5, max_steps=3,
                     max_grad_norm=0.0, optim="sgd", learning_rate=1e-1)
    ref_dirs, ref, trl_trainer = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, **overrides)
    got_dirs, got, trainer = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path,
                                 **overrides)
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    ref_weights = torch.cat([p.detach().reshape(-1) for p in trainer.ref_model.parameters()])
    assert (ref_weights - initial).norm() > 0, "the reference model was never synced"
    trl_ref_weights = torch.cat([p.detach().reshape(-1) for p in trl_trainer.ref_model.parameters()])
    assert rel(ref_weights, trl_ref_weights) <= TOL
    assert len(got_dirs) == len(ref_dirs) == 3
    for a, b in zip(got_dirs, ref_dirs, strict=True):
        assert rel(a, b) <= TOL
    assert rel(got - initial, ref - initial) <= TOL
