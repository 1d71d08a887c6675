"""ThunderSyncGKDTrainer end to end on tiny models: drop-in for TRL's GKD script, parity with TRL's generalized JSD
on the same on-policy samples, schedules and backward variants giving the same parameters, multi-turn tools."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from datasets import Dataset
from trl.experimental.gkd import GKDConfig, GKDTrainer

from benchmarks.parity import CaptureGrads, load_model, relative_error
from benchmarks.scripted import ScriptedTurnGenerator, tool_call_text
from trl_thundersync import ThunderSyncGKDConfig, ThunderSyncGKDTrainer
from trl_thundersync.errors import ConfigurationError, UnsupportedOptionError, VocabularyMismatchError
from trl_thundersync.tiny.model import save_tiny_model
from trl_thundersync.trainers.gkd.rollout import agent_engine

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny-teacher", hidden_size=96, num_layers=3,
                               seed=7))


def messages(n=8):
    return Dataset.from_dict({"messages": [[{"role": "user", "content": f"What is {i} + {i}?"},
                                            {"role": "assistant", "content": f"{i} + {i} = {2 * i}."}]
                                           for i in range(n)]})


def config(tmp_path, **overrides):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                per_device_train_batch_size=4, max_steps=2, max_new_tokens=10, lmbda=1.0, logging_steps=1,
                save_strategy="no", disable_tqdm=True, seed=0, learning_rate=1e-2, optim="sgd",
                max_grad_norm=1e9, rollout_engine="local_thread")
    base.update(overrides)
    return ThunderSyncGKDConfig(**base)


def params(trainer):
    return torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])


def update(trainer, model_path):
    """θ_final − θ_0: the comparisons below are on the updates, not on the (much larger) parameters."""
    return params(trainer) - torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters()])


def test_drop_in_gkd_script_mixes_on_and_off_policy(tmp_path, tokenizer, tiny_model_path, teacher_path):
    # A TRL GKD script with the two names swapped (model and teacher given as paths, messages data).
    args = config(tmp_path, lmbda=0.5, max_steps=4, seq_kd=True, peak_flops_per_s=1e12)
    trainer = ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=teacher_path, args=args,
                                    train_dataset=messages(), processing_class=tokenizer)
    before = params(trainer).clone()
    trainer.train()
    logs = trainer.state.log_history
    on_policy = [entry for entry in logs if "thundersync/on_policy" in entry]
    assert 0 < len(on_policy) < 4  # lmbda=0.5 with seed 0 draws both kinds of steps
    assert all(entry["thundersync/teacher_scoring_seconds"] > 0 for entry in on_policy)
    # the learner thread's CPU in each streamed step: positive, and within the step's wall time
    assert all(0 < e["thundersync/learner_cpu_seconds"] <= e["thundersync/step_wall_seconds"] + 0.05
               for e in on_policy)
    assert not torch.equal(before, params(trainer))
    lines = (tmp_path / "thundersync_trace" / "steps.jsonl").read_text().splitlines()
    lanes = {event["lane"] for event in json.loads(lines[-1])["events"]}
    assert {"rollout", "teacher", "learner", "barrier"} <= lanes
    # the learner's FLOPs, as GRPO's trace counts them (`trace.recorder.build_step_trace`), and their rate
    assert any(e["flops"] > 0 for e in json.loads(lines[-1])["events"] if e["kind"] == "turn_backward")
    assert all(entry["thundersync/learner_tflops_per_s"] > 0 for entry in on_policy)
    # peak_flops_per_s, as GRPO's: the trainer's active MFU against that peak
    assert all(0 < entry["thundersync/trainer_active_mfu"] < 1 for entry in on_policy)


def test_generalized_jsd_gradient_matches_trl_on_the_same_samples(tmp_path, tokenizer, tiny_model_path,
                                                                  teacher_path):
    capture = CaptureGrads()
    # GKDTrainer.generalized_jsd_loss without num_items_in_batch divides by the scored tokens: that normalizer here
    # (stock GKDTrainer's own num_items_in_batch: tests/integration/test_gkd_vs_stock_trl.py)
    args = config(tmp_path, max_steps=1, beta=0.3, objective="gjsd", on_policy_normalizer="scored_tokens")
    trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                    args=args, train_dataset=messages(), processing_class=tokenizer,
                                    callbacks=[capture])
    samples = []
    record = trainer._record_step
    trainer._record_step = lambda *a: (samples.extend(i.rollout for i in trainer._open_step[3]
                                                      if hasattr(i, "rollout")), record(*a))
    trainer.train()
    streamed = capture.directions[0]

    # TRL: a right-padded batch of the same prompt + completion tokens, labels -100 on prompt and padding.
    student, teacher = load_model(tiny_model_path), load_model(teacher_path)
    rows = [list(r.prompt_ids) + list(r.completion_ids) for r in sorted(samples, key=lambda r: r.index)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attention = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (row, r) in enumerate(zip(rows, sorted(samples, key=lambda r: r.index), strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        labels[i, len(r.prompt_ids) : len(row)] = torch.tensor(r.completion_ids)
    with torch.no_grad():
        teacher_logits = teacher(input_ids=ids, attention_mask=attention).logits
    loss = GKDTrainer.generalized_jsd_loss(student(input_ids=ids, attention_mask=attention).logits[:, :-1],
                                           teacher_logits[:, :-1], labels[:, 1:], beta=0.3)
    grads = torch.autograd.grad(loss, list(student.parameters()))
    reference = torch.cat([g.reshape(-1) for g in grads])
    assert relative_error(streamed, reference) <= 1e-5


@pytest.mark.parametrize("objective", ["opd", "gjsd"])
def test_schedules_and_backwards_give_the_same_parameters(tmp_path, tokenizer, tiny_model_path, teacher_path,
                                                           objective):
    results, directions = [], []
    for name, overrides in [("ts", {}), ("sync", {"schedule": "sync"}), ("naive", {"turn_backward": "naive"})]:
        args = config(tmp_path / name, objective=objective, **overrides)
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=args, train_dataset=messages(), processing_class=tokenizer,
                                        callbacks=[capture])
        trainer.train()
        results.append(update(trainer, tiny_model_path))
        directions.append(capture.directions[0])
    assert results[0].norm() > 0
    for other in (1, 2):  # the batch direction of step 1 (invariant 3), then the parameters after two steps
        assert relative_error(directions[other], directions[0]) <= 1e-5
        assert relative_error(results[other], results[0]) <= 1e-4


@pytest.mark.parametrize("objective", ["opd", "gjsd"])
def test_gradient_accumulation_streams_one_logical_batch(tmp_path, tokenizer, tiny_model_path, teacher_path,
                                                         objective):
    # per_device_train_batch_size=2 × gradient_accumulation_steps=2 is one logical batch of 4 rows, one optimizer
    # step: the same rows, seeds, samples and direction as the batch-synchronous reference with 4 rows per batch.
    runs = {}
    for name, overrides in [("reference", dict(per_device_train_batch_size=4, schedule="sync")),
                            ("accumulated", dict(per_device_train_batch_size=2, gradient_accumulation_steps=2))]:
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=config(tmp_path / name, objective=objective, **overrides),
                                        train_dataset=messages(), processing_class=tokenizer, callbacks=[capture])
        trainer.train()
        logs = [h for h in trainer.state.log_history if "thundersync/scored_tokens" in h]
        runs[name] = (capture.directions, params(trainer), logs, trainer.policy_version)
    (ref_dirs, ref_params, ref_logs, ref_version), (dirs, final, logs, version) = runs["reference"], runs["accumulated"]
    assert len(dirs) == len(ref_dirs) == 2 and version == ref_version == 2  # two optimizer steps, two publications
    assert [h["thundersync/scored_tokens"] for h in logs] == [h["thundersync/scored_tokens"] for h in ref_logs]
    assert [h["loss"] for h in logs] == pytest.approx([h["loss"] for h in ref_logs], rel=1e-5)
    assert ref_dirs[0].norm() > 0
    for mine, theirs in zip(dirs, ref_dirs, strict=True):
        assert relative_error(mine, theirs) <= 1e-6
    assert relative_error(final, ref_params) <= 1e-6


def test_open_trajectory_cap_gives_the_same_direction(tmp_path, tokenizer, tiny_model_path, teacher_path):
    directions, peaks = [], []
    for name, overrides in [("uncapped", {}), ("capped", {"max_open_trajectories": 1})]:
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=config(tmp_path / name, max_steps=1, **overrides),
                                        train_dataset=messages(), processing_class=tokenizer, callbacks=[capture])
        trainer.train()
        directions.append(capture.directions[0])
        peaks.append(trainer.state.log_history[0]["thundersync/open_trajectories_peak"])
    assert peaks[1] == 1 and directions[0].norm() > 0
    assert relative_error(directions[1], directions[0]) <= 1e-5
    with pytest.raises(ConfigurationError, match="max_open_trajectories=0"):
        config(tmp_path, max_open_trajectories=0)


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


def script(index: int, turn: int, context: str) -> str:
    return tool_call_text("increment", {"amount": index + turn}) if turn < 1 + index % 3 else "Done."


def prompts(n=4):
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Reach {i}."}] for i in range(n)],
                              "target": list(range(n))})


def test_multi_turn_tools_stream_per_turn_and_schedules_agree(tmp_path, tokenizer, tiny_model_path, teacher_path):
    results, logs, directions = [], [], []
    for name, overrides in [("ts", {}), ("sync", {"schedule": "sync"}), ("naive", {"turn_backward": "naive"})]:
        args = config(tmp_path / name, objective="opd", agent_max_turns=4, max_new_tokens=64, **overrides)
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=args, train_dataset=prompts(), processing_class=tokenizer,
                                        environment_factory=CounterEnv, callbacks=[capture])
        generator = ScriptedTurnGenerator(tokenizer, script, delay=lambda i, t: 0.002 * ((5 * i + t) % 3))
        trainer._engine = agent_engine(generator, args, tokenizer=trainer.processing_class, tools=None,
                                       environment_factory=CounterEnv, on_turn=trainer._router)
        trainer.train()
        assert generator.publications == [1, 2]
        results.append(update(trainer, tiny_model_path))
        directions.append(capture.directions[0])
        logs.append(trainer.state.log_history)
    assert results[0].norm() > 0
    for other in (1, 2):
        assert relative_error(directions[other], directions[0]) <= 1e-5
        assert relative_error(results[other], results[0]) <= 1e-4
    first = logs[0][0]
    assert first["thundersync/turns"] == sum(2 + i % 3 for i in range(4))  # tool-call turns + the final answer
    events = json.loads((tmp_path / "ts" / "thundersync_trace" / "steps.jsonl").read_text().splitlines()[0])["events"]
    turns = [e for e in events if e["kind"] == "turn"]
    assert len(turns) == first["thundersync/turns"] and all(e["tokens"] > 0 for e in turns)  # each turn's actions
    assert first["agent/turns_mean"] == 11 / 4 and first["thundersync/teacher_busy_seconds"] > 0


def test_refusals_name_the_field(tmp_path, tokenizer, tiny_model_path, teacher_path):
    with pytest.raises(UnsupportedOptionError, match="gradient_accumulation_steps=2 is not supported: with lmbda=0.5"):
        config(tmp_path, gradient_accumulation_steps=2, lmbda=0.5, on_policy_normalizer="scored_tokens")
    with pytest.raises(UnsupportedOptionError, match="on_policy_normalizer='scored_tokens'"):
        config(tmp_path, gradient_accumulation_steps=2, lmbda=0.5, objective="opd")  # OPD's default normalizer
    mixed = config(tmp_path, gradient_accumulation_steps=2, lmbda=0.5)  # stock GKD's count: each micro-step alone
    assert mixed.on_policy_normalizer == "num_items_in_batch"
    assert config(tmp_path, gradient_accumulation_steps=2).gradient_accumulation_steps == 2  # lmbda=1: one batch
    with pytest.raises(UnsupportedOptionError, match="gradient_checkpointing"):
        config(tmp_path, gradient_checkpointing=True, turn_backward="boundary_cut")
    assert config(tmp_path, gradient_checkpointing=True).turn_backward == "naive"
    with pytest.raises(UnsupportedOptionError, match="lmbda"):
        ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=teacher_path, args=config(tmp_path, lmbda=0.5),
                              train_dataset=prompts(), processing_class=tokenizer, environment_factory=CounterEnv)


def test_plain_trl_gkd_config_is_converted(tmp_path, tokenizer, tiny_model_path, teacher_path):
    """A trl GKDConfig (what stock GKDTrainer takes) trains as the ThunderSyncGKDConfig with the same values."""
    values = dict(output_dir=str(tmp_path / "plain"), use_cpu=True, bf16=False, gradient_checkpointing=False,
                  report_to="none", per_device_train_batch_size=4, max_steps=1, max_new_tokens=10, lmbda=1.0,
                  beta=0.3, save_strategy="no", disable_tqdm=True, seed=0, learning_rate=1e-2, optim="sgd")
    plain = GKDConfig(**values)
    trl_fields = [f.name for f in dataclasses.fields(GKDConfig) if f.init]
    assert [n for n in trl_fields if getattr(ThunderSyncGKDConfig.from_trl(plain), n) != getattr(plain, n)] == []
    directions, trainers = [], []
    for args in (ThunderSyncGKDConfig(**{**values, "output_dir": str(tmp_path / "native")}), plain):
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=args, train_dataset=messages(), processing_class=tokenizer,
                                        callbacks=[capture])
        trainer.train()
        directions.append(capture.directions[0])
        trainers.append(trainer)
    converted, native = trainers[1].args, trainers[0].args  # as GKDTrainer left them (it sets two fields)
    assert type(converted) is ThunderSyncGKDConfig
    every = [f.name for f in dataclasses.fields(ThunderSyncGKDConfig) if f.init and f.name != "output_dir"]
    assert [n for n in every if getattr(converted, n) != getattr(native, n)] == []
    assert directions[0].norm() > 0 and relative_error(directions[1], directions[0]) <= 1e-5  # arrival order
    with pytest.raises(UnsupportedOptionError, match="use_liger_kernel=True is not supported"):
        ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=teacher_path, train_dataset=messages(),
                              args=GKDConfig(**{**values, "use_liger_kernel": True}), processing_class=tokenizer)


def test_teacher_with_another_vocabulary_is_refused(tmp_path, tokenizer, tiny_model_path):
    from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer

    other_tokenizer = build_tiny_tokenizer(vocab_size=400)
    other = build_tiny_model(other_tokenizer)
    with pytest.raises(VocabularyMismatchError, match="vocab_size"):
        ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=other, args=config(tmp_path),
                              train_dataset=messages(), processing_class=tokenizer)
    path = tmp_path / "other"
    other_tokenizer.save_pretrained(path)
    build_tiny_model(build_tiny_tokenizer(), seed=3).save_pretrained(path)  # same size, different tokenizer
    with pytest.raises(VocabularyMismatchError, match="tokenizer differs"):
        ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=str(path), args=config(tmp_path),
                              train_dataset=messages(), processing_class=tokenizer)


@pytest.mark.parametrize("objective, extra_tokens", [("gjsd", 37), ("opd", 0)])
def test_teacher_vocab_map_gives_the_same_vocabulary_update(tmp_path, tokenizer, tiny_model_path, teacher_path,
                                                             objective, extra_tokens):
    # The teacher's token rows moved to other ids (and, for the generalized JSD, 37 extra tokens): with the map, the
    # student's update is the one the same-vocabulary teacher gives.
    from tests.fixtures.vocab import relabelled_teacher

    other, mapping = relabelled_teacher(load_model(teacher_path), extra_tokens=extra_tokens, seed=3)
    path = tmp_path / "map.json"
    path.write_text(json.dumps(mapping))
    directions = []
    for name, teacher, overrides in [("same", load_model(teacher_path), {}),
                                     ("mapped", other, {"teacher_vocab_map": str(path)})]:
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=teacher,
                                        args=config(tmp_path / name, objective=objective, max_steps=1, **overrides),
                                        train_dataset=messages(), processing_class=tokenizer, callbacks=[capture])
        trainer.train()
        directions.append(capture.directions[0])
    # FP32 order: the permuted teacher's log-softmax sums its vocabulary in another order, and OPD's advantages are
    # small differences of log-probabilities, so that rounding shows at ~7e-7 of the direction (GJSD: 0 here).
    assert directions[0].norm() > 0 and relative_error(directions[1], directions[0]) <= 5e-6
    if extra_tokens:  # without the map, the other vocab_size is refused and the message names the fix
        with pytest.raises(VocabularyMismatchError, match="teacher_vocab_map"):
            ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=other, args=config(tmp_path / "refused"),
                                  train_dataset=messages(), processing_class=tokenizer)
    path.write_text(json.dumps(mapping[:-1]))
    with pytest.raises(VocabularyMismatchError, match="entries but the student's vocab_size"):
        ThunderSyncGKDTrainer(model=tiny_model_path, teacher_model=other,
                              args=config(tmp_path / "short", teacher_vocab_map=str(path)),
                              train_dataset=messages(), processing_class=tokenizer)
    with pytest.raises(UnsupportedOptionError, match="lmbda=0.5 is not supported: with teacher_vocab_map"):
        config(tmp_path, lmbda=0.5, teacher_vocab_map=str(path))


def test_teacher_server_gives_the_local_teacher_update(tmp_path, tokenizer, tiny_model_path, teacher_path):
    from tests.fixtures.fake_teacher_server import FakeTeacherServer

    local = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                  args=config(tmp_path / "local", objective="opd"), train_dataset=messages(),
                                  processing_class=tokenizer)
    local.train()
    server = FakeTeacherServer(load_model(teacher_path).eval())
    try:
        args = config(tmp_path / "server", objective="opd", teacher_server_url=server.url)
        remote = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), args=args, train_dataset=messages(),
                                       processing_class=tokenizer)
        remote.train()
    finally:
        server.close()
    assert len(server.requests) == 2 * 4  # one request per turn, 4 single-turn trajectories per step
    assert relative_error(update(remote, tiny_model_path), update(local, tiny_model_path)) <= 1e-5
    with pytest.raises(UnsupportedOptionError, match="objective='opd'"):
        config(tmp_path, teacher_server_url="http://127.0.0.1:1")


def test_lora_student_streams_the_same_direction(tmp_path, tokenizer, tiny_model_path, teacher_path):
    from peft import LoraConfig

    directions = []
    for name, overrides in [("cut", {}), ("naive", {"turn_backward": "naive"})]:
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(
            model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
            args=config(tmp_path / name, max_steps=1, objective="gjsd", **overrides), train_dataset=messages(),
            processing_class=tokenizer, callbacks=[capture],
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        trainer.train()
        directions.append(capture.directions[0])
    assert directions[0].numel() < sum(p.numel() for p in load_model(tiny_model_path).parameters()) // 5
    assert directions[0].norm() > 0
    assert relative_error(directions[1], directions[0]) <= 1e-5


def test_opd_under_trls_episode_streams_per_turn(tmp_path, tokenizer, tiny_model_path, teacher_path):
    """agent_protocol="trl" for distillation: both calls of a turn run, the turn without a call ends the episode,
    and every model turn is scored and streamed (sync and thundersync agree)."""
    def two_calls(index: int, turn: int, context: str) -> str:
        if turn == 0:
            return tool_call_text("increment", {"amount": 1}) + "\n" + tool_call_text("read", {})
        return "Done."

    directions, logs = [], []
    for name, overrides in [("ts", {}), ("sync", {"schedule": "sync"})]:
        args = config(tmp_path / name, objective="opd", agent_protocol="trl", max_tool_calling_iterations=3,
                      max_new_tokens=200, **overrides)
        capture = CaptureGrads()
        trainer = ThunderSyncGKDTrainer(model=load_model(tiny_model_path), teacher_model=load_model(teacher_path),
                                        args=args, train_dataset=prompts(), processing_class=tokenizer,
                                        environment_factory=CounterEnv, callbacks=[capture])
        generator = ScriptedTurnGenerator(tokenizer, two_calls)
        trainer._engine = agent_engine(generator, args, tokenizer=trainer.processing_class, tools=None,
                                       environment_factory=CounterEnv, on_turn=trainer._router)
        trainer.train()
        directions.append(capture.directions[0])
        logs.append(trainer.state.log_history[0])
    assert relative_error(directions[1], directions[0]) <= 1e-5
    assert logs[0]["thundersync/turns"] == 2 * 4 and logs[0]["agent/turns_mean"] == 2
    assert logs[0]["tools/call_frequency"] == 2  # both calls of the first turn ran
