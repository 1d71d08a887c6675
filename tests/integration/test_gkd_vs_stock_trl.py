"""ThunderSyncGKDTrainer against stock `trl.experimental.gkd.GKDTrainer` on identical generated completions.

Both trainers see the same dataset rows in the same order (same seed), draw on/off-policy alike (`random() <=
lmbda`), and sample the same completions through public seams: ThunderSync through `use_turn_generator` (a scripted
generator), stock TRL through its `generate_on_policy_outputs` hook, whose returned sequences go through TRL's own
EOS/padding masking. Completions are of free length — shorter and longer than the dataset answers, some cut at
`max_new_tokens` — so stock TRL's `num_items_in_batch` (the dataset answers' token count) differs from the scored
tokens, which is what these tests are about (TRL #6452, #6478).

The yardstick is the FP32 floor (`tests/fixtures/floors.py`): stock TRL against itself with the rows of every batch
reversed or rotated (same rows, same count, other summation order) or its completions padded to 16 columns (other
shapes), the largest of these, never below FP32's spacing. ThunderSync must be within 2× that floor (3× for AdamW,
whose 1/√v amplifies rounding), and the scored-token normalizer must be visibly off (so the comparison can fail).
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest
import torch

from benchmarks.parity import load_model
from tests.fixtures.floors import assert_within_floor
from tests.fixtures.gkd_stock import (
    CASES,
    FLOOR_RUNS,
    Completions,
    fields,
    messages,
    relative_error,
    stock_run,
    thundersync_run,
)
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer
from trl_thundersync.errors import NoScoredTokensError, TeacherScoringError, UnsupportedOptionError
from trl_thundersync.tiny.model import save_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.exactness]  # the exactness layer (scripts/kernel_passes.sh)


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny-teacher", hidden_size=96, num_layers=3,
                               seed=7))


class EmptyCompletions(Completions):
    """Every completion has zero tokens (not even EOS)."""

    def _act(self, request, key, max_new_tokens, version):
        rollout = super()._act(request, key, max_new_tokens, version)
        return dataclasses.replace(rollout, completion_ids=(), sampling_logprobs=())


@pytest.mark.parametrize("case", list(CASES))
def test_gjsd_update_equals_stock_gkd_on_generated_completions(tmp_path, tokenizer, tiny_model_path, teacher_path,
                                                                case):
    overrides = CASES[case]
    stock = stock_run(tmp_path, "stock", tokenizer, tiny_model_path, teacher_path, **overrides)
    ours = thundersync_run(tmp_path, "ts", tokenizer, tiny_model_path, teacher_path, **overrides)

    @functools.cache
    def floor_run(name):
        return stock_run(tmp_path, name.replace(" ", "_"), tokenizer, tiny_model_path, teacher_path,
                         **FLOOR_RUNS[name], **overrides)

    factor = 3.0 if "adamw" in case else 2.0
    on_policy = [h for h in ours.logs if "thundersync/on_policy" in h]
    assert stock.update.norm() > 0 and on_policy
    # the normalizer in use is stock's count, not the scored tokens (else this test would not test it)
    assert any(h["thundersync/normalizer_tokens"] != h["thundersync/scored_tokens"] for h in on_policy)
    if case == "mixed_lmbda":  # both kinds of steps were drawn, at the same steps on both sides
        assert 0 < len(on_policy) < overrides["max_steps"]
    if case.startswith("mixed_lmbda_accumulation"):  # TRL's draws (python's random, seeded by the Trainer)
        random.seed(overrides.get("seed", 0))
        draws = [random.random() <= 0.5 for _ in range(2 * overrides["max_steps"])]
        windows = list(zip(draws[::2], draws[1::2], strict=True))
        assert {(True, False), (False, True)} & set(windows) and len(on_policy) == sum(map(any, windows))
    assert len(ours.directions) == len(stock.directions)
    for step, (mine, theirs) in enumerate(zip(ours.directions, stock.directions, strict=True)):
        assert_within_floor(relative_error(mine, theirs),
                            {name: functools.partial(lambda n, k: relative_error(floor_run(n).directions[k],
                                                                                 stock.directions[k]), name, step)
                             for name in FLOOR_RUNS}, factor=factor, what=f"{case} step {step + 1}")
    if "adamw" in case:  # AdamW's update is ~lr per element, far above the parameters' FP32 spacing
        assert_within_floor(relative_error(ours.update, stock.update),
                            {name: functools.partial(lambda n: relative_error(floor_run(n).update, stock.update), name)
                             for name in FLOOR_RUNS}, factor=factor, what=f"{case} parameters")
    losses = [h["loss"] for h in ours.logs if "loss" in h]
    assert losses == pytest.approx([h["loss"] for h in stock.logs if "loss" in h], rel=1e-4)


def test_scored_token_normalizer_is_distillation_trainers_and_differs(tmp_path, tokenizer, tiny_model_path,
                                                                       teacher_path):
    """on_policy_normalizer='scored_tokens' divides by the completions' tokens: the gradient is stock's × N_items /
    N_scored, step by step (SGD, one step: exactly that ratio)."""
    overrides = dict(max_steps=1)
    stock = stock_run(tmp_path, "stock", tokenizer, tiny_model_path, teacher_path, **overrides)
    ours = thundersync_run(tmp_path, "ts", tokenizer, tiny_model_path, teacher_path,
                           on_policy_normalizer="scored_tokens", **overrides)
    entry = next(h for h in ours.logs if "thundersync/on_policy" in h)
    assert entry["thundersync/normalizer_tokens"] == entry["thundersync/scored_tokens"]  # the scored count in use
    default = thundersync_run(tmp_path, "ts_default", tokenizer, tiny_model_path, teacher_path, **overrides)
    stock_items = next(h for h in default.logs if "thundersync/on_policy" in h)["thundersync/normalizer_tokens"]
    scored = entry["thundersync/scored_tokens"]
    assert stock_items != scored
    assert relative_error(ours.directions[0], stock.directions[0]) > 1e-2
    assert relative_error(ours.directions[0] * scored / stock_items, stock.directions[0]) <= 1e-5


def test_all_empty_completions_are_refused_under_either_normalizer(tmp_path, tokenizer, tiny_model_path,
                                                                    teacher_path):
    for normalizer in ("num_items_in_batch", "scored_tokens"):
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=ThunderSyncGKDConfig(**fields(tmp_path, normalizer, max_steps=1),
                                                                  rollout_engine="local_thread",
                                                                  on_policy_normalizer=normalizer),
                                        train_dataset=messages(), processing_class=tokenizer)
        trainer.use_turn_generator(EmptyCompletions(tokenizer))
        before = torch.cat([p.detach().reshape(-1).clone() for p in trainer.model.parameters()])
        with pytest.raises(NoScoredTokensError, match=r"optimizer step 1 .*zero scored completion tokens"):
            trainer.train()
        after = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
        assert torch.equal(before, after) and trainer.state.global_step == 0  # no optimizer step


def test_a_distillation_config_is_refused_by_name_with_the_reason(tmp_path, tokenizer, tiny_model_path,
                                                                   teacher_path):
    from trl import DistillationConfig

    args = DistillationConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none")
    with pytest.raises(UnsupportedOptionError, match=r"DistillationConfig.*temperature.*on_policy_normalizer"):
        ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=teacher_path, args=args,
                              train_dataset=messages(), processing_class=tokenizer)


def test_a_teacher_returning_nan_is_refused_naming_the_step(tmp_path, tokenizer, tiny_model_path, teacher_path):
    teacher = load_model(teacher_path)
    with torch.no_grad():
        teacher.get_output_embeddings().weight[3].fill_(float("nan"))  # NaN logits (and log-probs) everywhere
    trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=teacher,
                                    args=ThunderSyncGKDConfig(**fields(tmp_path, "nan", max_steps=1),
                                                              rollout_engine="local_thread"),
                                    train_dataset=messages(), processing_class=tokenizer)
    trainer.use_turn_generator(Completions(tokenizer))
    before = torch.cat([p.detach().reshape(-1).clone() for p in trainer.model.parameters()])
    with pytest.raises(TeacherScoringError, match=r"optimizer step 1 \(policy version 0\): trajectory \d+ turn 0: "
                                                  r".*NaN/inf; the optimizer step is refused"):
        trainer.train()
    after = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    assert torch.equal(before, after) and trainer.state.global_step == 0


def test_a_zero_num_items_in_batch_is_refused_naming_the_step(tmp_path, tokenizer, tiny_model_path, teacher_path):
    """transformers hands `training_step` a `num_items_in_batch` of 0 when no dataset row of the window has an
    answer token: stock GKD would divide by zero; the step is refused before anything reaches `param.grad`."""
    trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                    args=ThunderSyncGKDConfig(**fields(tmp_path, "zero", max_steps=1),
                                                              rollout_engine="local_thread"),
                                    train_dataset=messages(), processing_class=tokenizer)
    trainer.use_turn_generator(Completions(tokenizer))
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.current_gradient_accumulation_steps = 1  # what train() sets before its first window
    with pytest.raises(NoScoredTokensError, match=r"optimizer step 1 .*num_items_in_batch=0 on process 0"):
        trainer.training_step(trainer.model, batch, torch.tensor(0))
    assert all(p.grad is None for p in trainer.model.parameters())
