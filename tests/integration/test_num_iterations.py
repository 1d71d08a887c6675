"""`num_iterations > 1` against stock `trl.GRPOTrainer` on identical rollouts (`trainers/grpo/iterations.py`).

Pass 1 of every generation batch streams; passes 2..μ run TRL's own loss on the buffered batch (θ_k log-probs,
clipping). Two generation batches, so the sampler (each batch's rows reused μ times) and the policy-version
bookkeeping (θ published once per batch, the next batch sampled at the version published) are checked across
batches.
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import ITERATION_PARITY_CASES, load_model, relative_error, reward_len, run_trainer
from benchmarks.seed_floor import SEED_SCALES, rescaled_trainer
from tests.fixtures.floors import FP32_SPACING
from tests.fixtures.tools import env_reward, replay_rollout_func
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = pytest.mark.slow
TOL = 1e-5


class CountingEngine:
    """Wraps the rollout engine: records every publish (version) and the version each batch was sampled at."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.published: list[int] = []
        self.sampled_at: list[int] = []

    def publish(self, model, version):
        self.published.append(version)
        return self.inner.publish(model, version)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run(trainer_cls, config_cls, tmp_path, tokenizer, model_path, **kwargs):
    return run_trainer(trainer_cls, config_cls, tmp_path / trainer_cls.__name__, tokenizer, model_path, **kwargs)


def displacement(run, initial):
    return run.params - initial


@pytest.mark.parametrize("case", sorted(ITERATION_PARITY_CASES))
def test_num_iterations_sgd_matches_trl(case, tmp_path, tokenizer, tiny_model_path):
    mu = ITERATION_PARITY_CASES[case]["num_iterations"]
    overrides = dict(ITERATION_PARITY_CASES[case], max_steps=2 * mu, optim="sgd", learning_rate=1e-2,
                     max_grad_norm=0.5)  # two generation batches
    ref_calls, got_calls = [], []
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, tiny_model_path, rollout_calls=ref_calls, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path,
              rollout_calls=got_calls, **overrides)
    assert len(ref.directions) == len(got.directions) == 2 * mu
    # the same rows, generation batch by generation batch (TRL's RepeatSampler reuses each batch's rows μ times),
    # generated at the first step of each batch
    assert [step for step, _ in ref_calls] == [0, mu]
    assert got_calls == ref_calls
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    assert displacement(ref, initial).norm() > 0
    error = relative_error(displacement(got, initial), displacement(ref, initial))
    assert error <= TOL, f"{case}: Δθ relative error {error:.2e}"
    for k, (a, b) in enumerate(zip(got.directions, ref.directions, strict=True)):
        assert relative_error(a, b) <= TOL, f"{case}: optimizer step {k}: {relative_error(a, b):.2e}"
    # passes 2..μ are off-policy: their direction is not pass 1's (ratio ≠ 1 against θ_k's log-probs)
    assert relative_error(ref.directions[1], ref.directions[0]) > 1e-2
    if "epsilon" in overrides:  # and clipping is active in them
        assert max(h.get("clip_ratio/region_mean", 0.0) for h in ref.trainer.state.log_history) > 0


@pytest.mark.exactness
@pytest.mark.parametrize("case", ["mu2_dapo_clipping", "mu2_ga2_bnpo_beta", "mu3_grpo"])
def test_num_iterations_adamw_within_twice_the_floor(case, tmp_path, tokenizer, tiny_model_path):
    """AdamW amplifies rounding on near-zero coordinates; the floor is stock TRL against itself with each group's
    members permuted, or with its backward's per-token seeds rescaled (`benchmarks/seed_floor.py`: what any streaming
    learner, which back-propagates before the advantage exists, needs)."""
    mu = ITERATION_PARITY_CASES[case]["num_iterations"]
    overrides = dict(ITERATION_PARITY_CASES[case], max_steps=2 * mu, optim="adamw_torch", learning_rate=1e-4,
                     max_grad_norm=0.5)
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])

    def delta(trainer_cls, config_cls, name, **extra):
        result = run_trainer(trainer_cls, config_cls, tmp_path / name, tokenizer, tiny_model_path, **overrides,
                             **extra)
        return result, displacement(result, initial)

    ref, ref_delta = delta(GRPOTrainer, GRPOConfig, "trl")
    got, got_delta = delta(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, "thundersync")
    floor = max([relative_error(delta(GRPOTrainer, GRPOConfig, order, member_order=order)[1], ref_delta)
                 for order in ("reverse", "rotate")]
                + [relative_error(delta(rescaled_trainer(c), GRPOConfig, f"x{c:g}")[1], ref_delta)
                   for c in SEED_SCALES])
    assert floor < 1e-3
    error = relative_error(got_delta, ref_delta)
    assert error <= 2 * max(floor, FP32_SPACING), f"{case}: Δθ relative error {error:.2e}, floor {floor:.2e}"
    assert relative_error(got.params, ref.params) <= TOL
    assert relative_error(got.directions[0], ref.directions[0]) <= TOL


def test_publish_once_per_generation_batch_and_versions(tmp_path, tokenizer, tiny_model_path):
    engines = []

    def wrap(engine):
        engines.append(CountingEngine(engine))
        return engines[-1]

    mu = 3
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path,
              num_iterations=mu, max_steps=2 * mu, gradient_accumulation_steps=2, per_device_train_batch_size=2,
              wrap_engine=wrap, trace=True)
    trainer = got.trainer
    assert trainer.state.global_step == 2 * mu
    # θ goes out after the last pass of each generation batch only (TRL syncs when it generates)
    assert engines[0].published == [mu, 2 * mu]
    assert trainer.policy_version == 2 * mu
    # one trace line per generation batch; each batch's samples carry the version they were sampled at
    import json
    lines = [json.loads(line) for line in
             (tmp_path / "ThunderSyncGRPOTrainer" / "thundersync_trace" / "steps.jsonl").read_text().splitlines()]
    assert [t["step"] for t in lines] == [0, mu]
    for trace in lines:
        versions = {e["policy_version"] for e in trace["events"] if e["lane"] == "rollout"}
        assert versions == {trace["step"]}
        assert not [e for e in trace["events"] if e["lane"] == "publish"]  # nothing is published after pass 1


@pytest.mark.parametrize("mode", ["sequence_mask", "token_mask"])
def test_vllm_importance_sampling_correction_matches_trl(mode, tmp_path, tokenizer, tiny_model_path, monkeypatch):
    """use_vllm=True (TRL's default correction on): passes 2..μ multiply TRL's loss by the buffered ratio of θ_k's
    log-probs to the sampler's, as TRL does (harness of test_vllm_importance_sampling.py: TRL's vLLM backend
    stubbed, the same scripted trajectories and sampler log-probs for both trainers)."""
    import trl.trainer.grpo_trainer as trl_grpo

    from benchmarks.parity import CaptureGrads, cpu_config, prompt_dataset
    from tests.fixtures.sampler_logprobs import CASES, _NoVLLM, rollout_with_sampler_logprobs

    monkeypatch.setattr(trl_grpo, "VLLMGeneration", _NoVLLM)
    overrides = dict(CASES[mode], num_iterations=2, max_steps=4, optim="sgd", learning_rate=1e-2, max_grad_norm=0.5,
                     epsilon=0.03)
    runs = {}
    for name, trainer_cls, config_cls in (("trl", GRPOTrainer, GRPOConfig),
                                          ("thundersync", ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig)):
        vllm = dict(use_vllm=True, vllm_mode="server") if name == "trl" else {}
        capture = CaptureGrads()
        trainer = trainer_cls(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                              args=cpu_config(config_cls, tmp_path / name, **vllm, **overrides),
                              train_dataset=prompt_dataset(), processing_class=tokenizer,
                              rollout_func=rollout_with_sampler_logprobs(tokenizer), callbacks=[capture])
        if name == "thundersync":  # rollout_func with use_vllm=True is refused; switch it on after construction
            trainer.args.use_vllm = True
        trainer.train()
        runs[name] = capture.directions
    assert len(runs["trl"]) == len(runs["thundersync"]) == 4
    for k, (a, b) in enumerate(zip(runs["thundersync"], runs["trl"], strict=True)):
        assert relative_error(a, b) <= TOL, f"{mode}: optimizer step {k}: {relative_error(a, b):.2e}"


@pytest.mark.parametrize("case", ["ga2_bnpo_beta", "ga4_field_coef"])
def test_moe_router_aux_loss_matches_trl(case, tmp_path, tiny_moe):
    """MoE: pass 1 streams the router term per TRL micro-batch; passes 2..μ add it in TRL's own loss."""
    from benchmarks.parity import MOE_PARITY_CASES

    tokenizer, model_path = tiny_moe
    overrides = dict(MOE_PARITY_CASES[case], num_iterations=2, max_steps=4, optim="sgd", learning_rate=1e-2,
                     max_grad_norm=0.5, epsilon=0.03)
    ref = run(GRPOTrainer, GRPOConfig, tmp_path, tokenizer, model_path, **overrides)
    got = run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, model_path, **overrides)
    assert len(ref.directions) == len(got.directions) == 4
    for k, (a, b) in enumerate(zip(got.directions, ref.directions, strict=True)):
        assert relative_error(a, b) <= TOL, f"{case}: optimizer step {k}: {relative_error(a, b):.2e}"
    ref_aux = [h["aux_loss"] for h in ref.trainer.state.log_history if "aux_loss" in h]
    got_aux = [h["aux_loss"] for h in got.trainer.state.log_history if "aux_loss" in h]
    assert len(ref_aux) == 4 and got_aux == pytest.approx(ref_aux, rel=1e-6)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    from transformers import AutoTokenizer

    from trl_thundersync.tiny.moe import save_tiny_moe_model

    path = str(save_tiny_moe_model(tmp_path_factory.mktemp("tiny-moe") / "tiny-qwen3-moe"))
    return AutoTokenizer.from_pretrained(path), path


def test_two_processes_match_trl(tmp_path, tiny_model_path):
    """DDP (two CPU processes over gloo): pass 1's direction is averaged at the barrier, passes 2..μ are TRL's own
    DDP backward (`ddp_parity_script.py`, case mu2_bnpo_ga2_beta: two generation batches of two passes)."""
    from tests.fixtures.ddp_parity import run_ddp_parity

    ref, got = run_ddp_parity(tmp_path, tiny_model_path, "mu2_bnpo_ga2_beta")
    assert len(ref["directions"]) == len(got["directions"]) == 4
    assert relative_error(ref["directions"][1], ref["directions"][0]) > 1e-2
    for k, (a, b) in enumerate(zip(got["directions"], ref["directions"], strict=True)):
        assert relative_error(a, b) <= TOL, f"optimizer step {k}: {relative_error(a, b):.2e}"
    assert relative_error(got["params"], ref["params"]) <= TOL


@pytest.mark.parametrize("release", ["content", "turn"])
def test_multi_turn_tool_trajectories_match_trl(release, tmp_path, tokenizer, tiny_model_path):
    """Agent trajectories (environment_factory; tool tokens attended, not scored): passes 2..μ carry TRL's tool_mask.
    Stock TRL replays ThunderSync's trajectories through rollout_func (env_mask = TRL's tool mask)."""
    from benchmarks.parity import CaptureGrads, cpu_config
    from tests.fixtures.agentic_trainer import dataset, make_trainer

    options = dict(num_iterations=2, epsilon=0.03, beta=0.1, loss_type="grpo")
    trainer, capture, captured, generator = make_trainer(tmp_path / "ts", tokenizer, tiny_model_path,
                                                         delay=lambda i, t: 0.002 * ((7 * i + t) % 5),
                                                         release=release, **options)
    trainer.args.max_steps = 4  # two generation batches of two passes
    trainer.train()
    assert generator.publications == [2, 4]  # θ goes out once per generation batch
    assert len(captured) == 2 and any(0 in r.env_mask for r, _ in captured[0])
    rollout_func = replay_rollout_func(captured, steps_per_batch=2)

    ref_capture = CaptureGrads()
    args = cpu_config(GRPOConfig, tmp_path / "trl", max_steps=4, max_completion_length=256, optim="sgd", **options)
    ref = GRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[env_reward], args=args,
                      train_dataset=dataset(), processing_class=tokenizer, rollout_func=rollout_func,
                      callbacks=[ref_capture])
    ref.train()
    assert len(capture.directions) == len(ref_capture.directions) == 4
    assert relative_error(ref_capture.directions[1], ref_capture.directions[0]) > 1e-2
    for k, (got, want) in enumerate(zip(capture.directions, ref_capture.directions, strict=True)):
        assert relative_error(got, want) <= TOL, f"{release}: optimizer step {k}: {relative_error(got, want):.2e}"


@pytest.mark.parametrize("overrides, computed", [(dict(beta=0.1), 0), (dict(mask_truncated_completions=True), None)])
def test_old_log_probs_come_from_the_streamed_forwards(overrides, computed, tmp_path, tokenizer, tiny_model_path,
                                                       monkeypatch):
    """θ_k's (and the reference's) log-probs of passes 2..μ are the streamed pass's own, kept detached: no second
    forward over the batch; only rows the streamed pass did not forward (masked truncations) are computed."""
    from trl_thundersync.trainers.grpo import iterations as grpo_iterations

    calls = []
    original = grpo_iterations.logps_rows

    def spy(store, keys, forward, like, width, fill):
        calls.append((len(keys), sum(key not in store for key in keys)))
        return original(store, keys, forward, like, width, fill)

    monkeypatch.setattr(grpo_iterations, "logps_rows", spy)
    run(ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig, tmp_path, tokenizer, tiny_model_path, num_iterations=2,
        max_steps=4, **overrides)
    assert len(calls) == (4 if "beta" in overrides else 2)  # old (and ref) per generation batch
    if computed is not None:
        assert all(missing == computed for _, missing in calls)
    else:  # the masked truncated rows, never forwarded by the streamed pass
        assert all(0 < missing < rows for rows, missing in calls)


@pytest.mark.parametrize("stop", [2, 1])
def test_resume_from_checkpoint_matches_trl(stop, tmp_path, tokenizer, tiny_model_path):
    """Resumed at a generation-batch boundary (step 2) or inside one (step 1, where the buffered batch is gone and
    TRL generates afresh at the current θ, as ThunderSync streams afresh): the same parameters as stock TRL."""
    from benchmarks.parity import StopAt, cpu_config, prompt_dataset, scripted_rollout_func

    common = dict(num_iterations=2, max_steps=4, optim="sgd", max_grad_norm=0.5, save_strategy="steps",
                  save_steps=stop)
    params = {}
    for name, trainer_cls, config_cls in (("trl", GRPOTrainer, GRPOConfig),
                                          ("ts", ThunderSyncGRPOTrainer, ThunderSyncGRPOConfig)):
        out = tmp_path / name

        def make(callbacks=(), trainer_cls=trainer_cls, config_cls=config_cls, out=out):
            return trainer_cls(model=load_model(tiny_model_path), reward_funcs=[reward_len],
                               args=cpu_config(config_cls, out, **common), train_dataset=prompt_dataset(),
                               processing_class=tokenizer, rollout_func=scripted_rollout_func(tokenizer),
                               callbacks=list(callbacks))

        make([StopAt(stop)]).train()
        second = make()
        second.train(resume_from_checkpoint=str(out / f"checkpoint-{stop}"))
        assert second.state.global_step == 4
        params[name] = torch.cat([p.detach().reshape(-1) for p in second.model.parameters()])
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(tiny_model_path).parameters()])
    assert relative_error(params["ts"] - initial, params["trl"] - initial) <= TOL
