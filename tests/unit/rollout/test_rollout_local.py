"""LocalProcessEngine and policy_state_dict on the tiny offline model (CPU, a few seconds per spawned worker)."""

from __future__ import annotations

import copy
import os
import signal

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_thundersync.errors import RolloutError
from trl_thundersync.rollout.engine import RolloutEngine
from trl_thundersync.rollout.local import EngineStats, LocalProcessEngine
from trl_thundersync.rollout.weights import base_config, policy_state_dict
from trl_thundersync.tiny.model import save_tiny_model
from trl_thundersync.types import RolloutRequest, SamplingParams

MAX_NEW = 24
TEMPERATURE = 0.7
PROMPTS = ("2 + 3 = ", "Count the letters in", "def add(a, b):", "The quick brown fox", "$ pytest -q")
N = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def requests(tiny):
    _, tok = tiny
    prompts = [tuple(tok(PROMPTS[i % len(PROMPTS)])["input_ids"]) for i in range(N)]
    return [RolloutRequest(index=i, group=i // 2, prompt_ids=prompts[i], seed=1000 + i) for i in range(N)]


def _generate(engine, requests, version=0):
    engine.start_batch(requests, policy_version=version)
    return list(engine.results())


def _by_index(rollouts):
    return {r.index: r.completion_ids for r in rollouts}


@pytest.fixture(scope="module")
def full_completions(tiny, requests):
    """Completions with no EOS at all: every trajectory runs to MAX_NEW tokens."""
    engine = LocalProcessEngine(tiny[0], SamplingParams(MAX_NEW, temperature=TEMPERATURE), mode="thread")
    try:
        return _by_index(_generate(engine, requests))
    finally:
        engine.close()


@pytest.fixture(scope="module")
def sampling(full_completions):
    """EOS ids picked from the EOS-free completions so that trajectories end early, at known, varied lengths."""
    eos = {full_completions[N - 1][1], full_completions[N - 3][6], full_completions[0][12]}
    return SamplingParams(MAX_NEW, temperature=TEMPERATURE, eos_token_ids=tuple(sorted(eos)))


@pytest.fixture(scope="module")
def expected(full_completions, sampling):
    """index -> completion: the EOS-free completion cut after its first EOS (a seed fixes every draw)."""
    out = {}
    for i, full in full_completions.items():
        cut = next((j + 1 for j, t in enumerate(full) if t in sampling.eos_token_ids), MAX_NEW)
        out[i] = full[:cut]
    return out


@pytest.fixture(scope="module")
def process_run(tiny, requests, sampling):
    # Same intra-op thread count as the thread-mode engines below, so both run the same kernels.
    engine = LocalProcessEngine(tiny[0], sampling, mode="process", max_in_flight=N, num_threads=torch.get_num_threads())
    try:
        rollouts = _generate(engine, requests)
        return rollouts, engine.stats()
    finally:
        engine.close()


def test_every_request_comes_back_once_with_its_fields(process_run, requests, sampling):
    rollouts, stats = process_run
    assert sorted(r.index for r in rollouts) == list(range(N))
    by_req = {q.index: q for q in requests}
    for r in rollouts:
        assert (r.group, r.prompt_ids, r.policy_version) == (by_req[r.index].group, by_req[r.index].prompt_ids, 0)
        assert 1 <= len(r.completion_ids) <= MAX_NEW
        assert len(r.sampling_logprobs) == len(r.completion_ids)
        if len(r.completion_ids) < MAX_NEW:
            assert r.completion_ids[-1] in sampling.eos_token_ids
        assert not any(t in sampling.eos_token_ids for t in r.completion_ids[:-1])
        assert r.started_at < r.finished_at
    assert any(len(r.completion_ids) < MAX_NEW for r in rollouts)
    assert stats == EngineStats(N, sum(len(r.completion_ids) for r in rollouts), stats.generation_seconds, 0, 0.0)


def test_process_and_thread_modes_sample_identical_tokens(process_run, expected, tiny, requests, sampling):
    rollouts, _ = process_run
    assert _by_index(rollouts) == expected
    engine = LocalProcessEngine(tiny[0], sampling, mode="thread", max_in_flight=N)
    try:
        thread = {r.index: r for r in _generate(engine, requests)}
    finally:
        engine.close()
    for r in rollouts:
        assert thread[r.index].completion_ids == r.completion_ids
        assert thread[r.index].sampling_logprobs == r.sampling_logprobs


@pytest.mark.parametrize("max_in_flight", [1, 3, N])
def test_tokens_do_not_depend_on_schedule_or_request_order(tiny, requests, sampling, expected, max_in_flight):
    engine = LocalProcessEngine(tiny[0], sampling, mode="thread", max_in_flight=max_in_flight)
    try:
        assert _by_index(_generate(engine, requests)) == expected
        assert _by_index(_generate(engine, requests[::-1])) == expected
    finally:
        engine.close()


def test_results_arrive_in_completion_order(tiny, requests, sampling, expected):
    # All N in flight from the first tick, one token each per tick: a trajectory of length L is emitted at tick L,
    # ties in admission order. The EOS ids were chosen so that this order is not the index order.
    order = sorted(range(N), key=lambda i: (len(expected[i]), i))
    assert order != list(range(N))
    engine = LocalProcessEngine(tiny[0], sampling, mode="thread", max_in_flight=N)
    serial = LocalProcessEngine(tiny[0], sampling, mode="thread", max_in_flight=1)  # one at a time: arrival order
    try:
        assert [r.index for r in _generate(engine, requests)] == order
        assert [r.index for r in _generate(serial, requests[::-1])] == list(range(N))[::-1]
    finally:
        engine.close()
        serial.close()


def test_sampling_logprobs_match_teacher_forced_recomputation(process_run, tiny):
    model = tiny[0]
    for r in process_run[0]:
        ids = torch.tensor([r.prompt_ids + r.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.prompt_ids) - 1 : -1].float() / TEMPERATURE
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(r.completion_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(r.sampling_logprobs), ref, atol=1e-4, rtol=0)


def test_publish_serves_the_new_weights_and_refuses_stale_versions(tiny, requests, sampling):
    changed = copy.deepcopy(tiny[0])
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in changed.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    engine = LocalProcessEngine(tiny[0], sampling, mode="process")
    fresh = LocalProcessEngine(changed, sampling, mode="thread")
    try:
        before = _by_index(_generate(engine, requests))
        assert isinstance(engine.publish(changed, policy_version=1), float)
        assert engine.policy_version == 1 and engine.stats().publications == 1
        with pytest.raises(RolloutError, match="serves version 1"):
            engine.start_batch(requests, policy_version=0)
        after = _generate(engine, requests, version=1)
        assert {r.policy_version for r in after} == {1}
        assert _by_index(after) == _by_index(_generate(fresh, requests)) != before
    finally:
        engine.close()
        fresh.close()
        engine.close()  # idempotent


def test_start_batch_refuses_a_second_open_batch_and_unpublished_versions(tiny, requests, sampling):
    engine = LocalProcessEngine(tiny[0], sampling, mode="thread")
    try:
        assert isinstance(engine, RolloutEngine)
        with pytest.raises(RolloutError, match="publish"):
            engine.start_batch(requests, policy_version=1)
        engine.start_batch(requests, policy_version=0)
        with pytest.raises(RolloutError, match="still open"):
            engine.start_batch(requests, policy_version=0)
        with pytest.raises(RolloutError, match="open"):
            engine.publish(tiny[0], policy_version=1)
        assert len(list(engine.results())) == N
    finally:
        engine.close()
    with pytest.raises(RolloutError, match="closed"):
        engine.start_batch(requests, policy_version=0)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_worker_exception_raises_rollout_error_with_its_traceback(tiny, requests, sampling, mode):
    vocab = tiny[0].config.vocab_size
    bad = RolloutRequest(index=N, group=N // 2, prompt_ids=(1, vocab + 5), seed=0)
    engine = LocalProcessEngine(tiny[0], sampling, mode=mode, max_in_flight=2)
    try:
        engine.start_batch([*requests, bad], policy_version=0)
        with pytest.raises(RolloutError, match=r"(?s)trajectories of the open batch lost.*(IndexError|index out of)"):
            list(engine.results())
        with pytest.raises(RolloutError, match="failed earlier"):
            engine.start_batch(requests, policy_version=0)
    finally:
        engine.close()


def test_killed_worker_raises_instead_of_hanging(tiny, requests, sampling):
    engine = LocalProcessEngine(tiny[0], SamplingParams(MAX_NEW, temperature=TEMPERATURE), mode="process")
    try:
        engine.start_batch(requests, policy_version=0)
        os.kill(engine.worker_pid, signal.SIGKILL)
        with pytest.raises(RolloutError, match=r"(?s)\d+ trajectories of the open batch lost.*exit code -9"):
            list(engine.results())
    finally:
        engine.close()


def _lora_model(model):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return peft_model


def test_policy_state_dict_merges_lora_without_touching_the_model(tiny):
    model = tiny[0]
    peft_model = _lora_model(model)
    before = {k: v.clone() for k, v in peft_model.state_dict().items()}
    state = policy_state_dict(peft_model)
    merged = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    assert set(state) == set(merged) == set(model.state_dict())
    for name, tensor in merged.items():
        assert state[name].dtype == torch.float32 and state[name].device.type == "cpu"
        assert torch.allclose(state[name], tensor, atol=1e-6, rtol=0), name
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(state[q_proj], model.state_dict()[q_proj])  # the delta is really there
    after = peft_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert base_config(peft_model) is peft_model.get_base_model().config


def test_policy_state_dict_of_a_plain_or_wrapped_model_is_a_detached_copy(tiny):
    model = tiny[0]
    wrapper = torch.nn.Module()
    wrapper.module = model  # what accelerate / DDP hand around
    state = policy_state_dict(wrapper)
    for name, tensor in model.state_dict().items():
        assert torch.equal(state[name], tensor) and state[name].data_ptr() != tensor.data_ptr()
    assert base_config(wrapper) is model.config


def test_submit_per_request_budget_and_keys(tiny):
    engine = LocalProcessEngine(tiny[0], SamplingParams(max_new_tokens=20, eos_token_ids=()), mode="thread")
    try:
        req = RolloutRequest(index=0, group=0, prompt_ids=(5, 6, 7), seed=11)
        short = engine.submit(req, key=(0, 0), max_new_tokens=3)
        long = engine.submit(req, key=(0, 1))
        assert len(short.result(timeout=60).completion_ids) == 3
        assert len(long.result(timeout=60).completion_ids) == 20
        # same seed and context: the shorter sample is a prefix of the longer one
        assert long.result().completion_ids[:3] == short.result().completion_ids
        engine.submit(req, key="dup")
        with pytest.raises(RolloutError, match="already in flight"):
            engine.submit(req, key="dup")
    finally:
        engine.close()
