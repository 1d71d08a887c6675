"""ThunderSyncGKDTrainer against stock `trl.experimental.gkd.GKDTrainer` on identical generated completions.

Both trainers see the same dataset rows in the same order (same seed), draw on/off-policy alike (`random() <=
lmbda`), and sample the same completions through public seams: ThunderSync through `use_turn_generator` (a scripted
generator), stock TRL through its `generate_on_policy_outputs` hook, whose returned sequences go through TRL's own
EOS/padding masking. Completions are of free length — shorter and longer than the dataset answers, some cut at
`max_new_tokens` — so stock TRL's `num_items_in_batch` (the dataset answers' token count) differs from the scored
tokens, which is what these tests are about (TRL #6452, #6478).

The yardstick is the FP32 floor: stock TRL against itself with the rows of every batch permuted (same rows, same
count, other summation order). ThunderSync must be within 2× that floor (3× for AdamW, whose 1/√v amplifies
rounding), and the scored-token normalizer must be visibly off (so the comparison can fail).
"""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from trl.experimental.gkd import GKDConfig, GKDTrainer
from trl.experimental.utils import DataCollatorForChatML

from benchmarks.parity import CaptureGrads, load_model
from benchmarks.scripted import ScriptedTurnGenerator
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer
from trl_thundersync.errors import NoScoredTokensError, TeacherScoringError, UnsupportedOptionError
from trl_thundersync.tiny.model import save_tiny_model

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 12
ROWS = 16


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny-teacher", hidden_size=96, num_layers=3,
                               seed=7))


def messages() -> Dataset:
    """Dataset answers of 2–5 words: their label count is stock GKD's on-policy normalizer."""
    answers = [" ".join(["It is"] + [str(2 * i)] * (i % 4)) for i in range(ROWS)]
    return Dataset.from_dict({"messages": [[{"role": "user", "content": f"What is {i} + {i}?"},
                                            {"role": "assistant", "content": answers[i]}] for i in range(ROWS)]})


def completion_text(prompt_text: str) -> str:
    """The on-policy completion of a prompt: by its row number, 0–14 words (long ones are cut at MAX_NEW_TOKENS)."""
    n = int(prompt_text.split("What is ")[1].split(" ")[0])
    return " ".join(["sum", str(n)] * ((3 * n + 1) % 8))


def script(index: int, turn: int, context: str) -> str:
    return completion_text(context)


class _Sequences:
    """A stand-in for `model.generate` returning fixed sequences, so TRL's own masking code runs on them."""

    def __init__(self, sequences: torch.Tensor) -> None:
        self.sequences = sequences

    def generate(self, **kwargs):
        return SimpleNamespace(sequences=self.sequences)


def stock_trainer_class(tokenizer):
    """Stock GKDTrainer whose on-policy samples are `completion_text` of each prompt, closed with EOS and cut at
    max_new_tokens as the scripted generator does, right-padded with pad tokens (HF generate's layout)."""

    class ScriptedGKDTrainer(GKDTrainer):
        @staticmethod
        def generate_on_policy_outputs(model, inputs, generation_config):
            prompts, mask = inputs["prompts"], inputs["prompt_attention_mask"]
            rows = []
            for i in range(prompts.shape[0]):
                text = tokenizer.decode(prompts[i][mask[i].bool()].tolist())
                ids = tokenizer.encode(completion_text(text), add_special_tokens=False) + [tokenizer.eos_token_id]
                rows.append(ids[:generation_config.max_new_tokens])
            width = max(map(len, rows))
            completions = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=prompts.dtype)
            for i, ids in enumerate(rows):
                completions[i, : len(ids)] = torch.tensor(ids)
            sequences = torch.cat([prompts, completions], dim=1)
            return GKDTrainer.generate_on_policy_outputs(_Sequences(sequences), inputs, generation_config)

    return ScriptedGKDTrainer


class PermutedRows:
    """TRL's ChatML collator with the rows of every batch reversed: the floor run (same rows, other order)."""

    def __init__(self, tokenizer) -> None:
        self.inner = DataCollatorForChatML(tokenizer=tokenizer)

    def __call__(self, examples):
        return self.inner(list(reversed(examples)))


def fields(tmp_path, name, **overrides) -> dict:
    base = dict(output_dir=str(tmp_path / name), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                disable_tqdm=True, seed=0, per_device_train_batch_size=4, max_steps=3, max_new_tokens=MAX_NEW_TOKENS,
                lmbda=1.0, beta=0.5, temperature=0.9, learning_rate=1e-2, optim="sgd", max_grad_norm=1e9,
                logging_steps=1, gradient_checkpointing=False)
    base.update(overrides)
    return base


def update(trainer, model_path) -> torch.Tensor:
    final = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
    return final - torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters()])


@dataclasses.dataclass(frozen=True)
class Run:
    directions: list[torch.Tensor]  # the clipped gradient the optimizer sees, per optimizer step
    update: torch.Tensor  # θ_final − θ_0
    logs: list[dict]


def stock_run(tmp_path, name, tokenizer, student, teacher, *, permuted=False, **overrides) -> Run:
    capture = CaptureGrads()
    trainer = stock_trainer_class(tokenizer)(
        model=load_model(student), teacher_model=load_model(teacher), args=GKDConfig(**fields(tmp_path, name,
                                                                                             **overrides)),
        train_dataset=messages(), processing_class=tokenizer, callbacks=[capture],
        data_collator=PermutedRows(tokenizer) if permuted else None)
    trainer.train()
    return Run(capture.directions, update(trainer, student), trainer.state.log_history)


def thundersync_run(tmp_path, name, tokenizer, student, teacher, **overrides) -> Run:
    capture = CaptureGrads()
    trainer = ThunderSyncGKDTrainer(model=load_model(student), teacher_model=load_model(teacher),
                                    args=ThunderSyncGKDConfig(**fields(tmp_path, name, **overrides),
                                                              rollout_engine="local_thread"),
                                    train_dataset=messages(), processing_class=tokenizer, callbacks=[capture])
    trainer.use_turn_generator(Completions(tokenizer))
    trainer.train()
    return Run(capture.directions, update(trainer, student), trainer.state.log_history)


class Completions(ScriptedTurnGenerator):
    """`completion_text` of each prompt, closed with EOS and cut at MAX_NEW_TOKENS (a generator samples with its own
    settings: `use_turn_generator` hands it no per-request budget for single-turn rows)."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer, script)

    def _act(self, request, key, max_new_tokens, version):
        return super()._act(request, key, max_new_tokens or MAX_NEW_TOKENS, version)


class EmptyCompletions(Completions):
    """Every completion has zero tokens (not even EOS)."""

    def _act(self, request, key, max_new_tokens, version):
        rollout = super()._act(request, key, max_new_tokens, version)
        return dataclasses.replace(rollout, completion_ids=(), sampling_logprobs=())


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


CASES = {  # GKDConfig overrides; every case trains 3 optimizer steps unless it says otherwise
    "beta0": dict(beta=0.0),
    "beta0.5": dict(beta=0.5),
    "beta1": dict(beta=1.0),
    "accumulation": dict(per_device_train_batch_size=2, gradient_accumulation_steps=2),
    "clipping": dict(max_grad_norm=0.05),
    "mixed_lmbda": dict(lmbda=0.5, max_steps=4),
    # lmbda < 1 with accumulation: windows that mix on- and off-policy micro-steps (seed 0 draws both kinds)
    # (seed 0 draws windows off+off, on+on, off+on, off+on; seed 3 on+off, on+off, off+on, on+off)
    "mixed_lmbda_accumulation": dict(lmbda=0.5, max_steps=4, per_device_train_batch_size=2,
                                     gradient_accumulation_steps=2, max_grad_norm=0.05),
    "mixed_lmbda_accumulation_seed3": dict(lmbda=0.5, max_steps=4, per_device_train_batch_size=2,
                                           gradient_accumulation_steps=2, seed=3),
    "adamw_1step": dict(optim="adamw_torch", learning_rate=1e-3, max_steps=1),
    "adamw_3steps": dict(optim="adamw_torch", learning_rate=1e-3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_gjsd_update_equals_stock_gkd_on_generated_completions(tmp_path, tokenizer, tiny_model_path, teacher_path,
                                                                case):
    overrides = CASES[case]
    stock = stock_run(tmp_path, "stock", tokenizer, tiny_model_path, teacher_path, **overrides)
    floor_run = stock_run(tmp_path, "floor", tokenizer, tiny_model_path, teacher_path, permuted=True, **overrides)
    ours = thundersync_run(tmp_path, "ts", tokenizer, tiny_model_path, teacher_path, **overrides)
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
    assert len(ours.directions) == len(stock.directions) == len(floor_run.directions)
    for step, (mine, theirs, permuted) in enumerate(zip(ours.directions, stock.directions, floor_run.directions,
                                                        strict=True), start=1):
        floor, error = relative_error(permuted, theirs), relative_error(mine, theirs)
        assert error <= factor * max(floor, 1e-7), f"{case} step {step}: {error:.3g} vs floor {floor:.3g}"
    if "adamw" in case:  # AdamW's update is ~lr per element, far above the parameters' FP32 spacing
        floor, error = relative_error(floor_run.update, stock.update), relative_error(ours.update, stock.update)
        assert error <= factor * max(floor, 1e-7), f"{case} parameters: {error:.3g} vs floor {floor:.3g}"
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
