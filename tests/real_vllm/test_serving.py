"""Our rollout client (`VLLMServerEngine`) against a real `vllm serve`: what it samples, the log-probs it reports
next to the learner's, seeds, the server's self-description, structured outputs, finish reasons and refusals."""

from __future__ import annotations

import re
import time
from concurrent.futures import wait

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.real_vllm.conftest import learner_logprobs
from trl_thundersync.errors import RolloutError
from trl_thundersync.rollout.vllm_api import http_call
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.types import RolloutRequest, SamplingParams

PROMPTS = ("What is 2 + 3?", "Count the letters in banana.", "def add(a, b):", "$ pytest -q")


@pytest.fixture(scope="module")
def tokenizer(real_vllm):
    return AutoTokenizer.from_pretrained(real_vllm.model)


@pytest.fixture(scope="module")
def learner(real_vllm):
    return AutoModelForCausalLM.from_pretrained(real_vllm.model, dtype=torch.float32).eval()


def requests(tokenizer, seed0: int = 11) -> list[RolloutRequest]:
    ids = [tuple(tokenizer(p)["input_ids"]) for p in PROMPTS]
    return [RolloutRequest(index=i, group=i // 2, prompt_ids=ids[i % len(ids)], seed=seed0 + i) for i in range(8)]


def engine(real_vllm, tokenizer, **sampling) -> VLLMServerEngine:
    params = SamplingParams(max_new_tokens=sampling.pop("max_new_tokens", 12), eos_token_ids=(tokenizer.eos_token_id,),
                            pad_token_id=tokenizer.pad_token_id, **sampling)
    return VLLMServerEngine([real_vllm.url], tokenizer, params, startup_timeout=30.0, **_engine_fields())


def _engine_fields() -> dict:
    return {}


def sample(eng: VLLMServerEngine, reqs) -> dict:
    futures = [eng.submit(r) for r in reqs]
    wait(futures)
    return {f.result().index: f.result() for f in futures}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_the_learners_fp32_logprobs(real_vllm, tokenizer, learner, temperature):
    eng = engine(real_vllm, tokenizer, temperature=temperature)
    try:
        out = sample(eng, requests(tokenizer))
    finally:
        eng.close()
    worst = 0.0
    for rollout in out.values():
        assert rollout.policy_version == 0 and len(rollout.completion_ids) > 0
        assert rollout.sampling_logprobs is not None and len(rollout.sampling_logprobs) == len(rollout.completion_ids)
        mine = learner_logprobs(learner, rollout.prompt_ids, rollout.completion_ids, temperature)
        worst = max(worst, (mine - torch.tensor(rollout.sampling_logprobs)).abs().max().item())
    assert worst <= 1e-5, f"vLLM's processed log-probs differ from the learner's FP32 log-probs by {worst:.2e}"


def test_seeds_reproduce_alone_batched_and_in_another_order(real_vllm, tokenizer):
    eng = engine(real_vllm, tokenizer)
    try:
        batched = sample(eng, requests(tokenizer))
        alone = {r.index: sample(eng, [r])[r.index] for r in requests(tokenizer)[:3]}
        reversed_order = sample(eng, list(reversed(requests(tokenizer))))
        other_seeds = sample(eng, requests(tokenizer, seed0=1000))
    finally:
        eng.close()
    for i, rollout in alone.items():
        assert rollout.completion_ids == batched[i].completion_ids
    assert {i: r.completion_ids for i, r in reversed_order.items()} == {i: r.completion_ids for i, r in batched.items()}
    assert any(other_seeds[i].completion_ids != batched[i].completion_ids for i in batched), "seeds are ignored"


def test_the_client_reads_the_servers_limits_and_logprob_mode(real_vllm, tokenizer):
    eng = engine(real_vllm, tokenizer)
    try:
        (limits,) = eng.server_limits
        assert eng.max_model_len == 1024  # --max-model-len, read from /v1/models
        assert eng.max_concurrency == limits.max_num_seqs == 128  # vLLM's CPU default, read from /server_info
    finally:
        eng.close()


def test_truncated_and_stopped_completions_are_told_apart(real_vllm, tokenizer):
    eng = engine(real_vllm, tokenizer, max_new_tokens=3)
    try:
        out = sample(eng, requests(tokenizer))
    finally:
        eng.close()
    for rollout in out.values():
        ended_on_eos = rollout.completion_ids[-1] == tokenizer.eos_token_id
        # vLLM's "length" finish gives exactly max_tokens; a "stop" ends on EOS (kept, as TRL keeps it); the client
        # leaves `truncated` to TRL's rule (None: judged from the last token, mask_truncated_completions)
        assert ended_on_eos or len(rollout.completion_ids) == 3, rollout.completion_ids
        assert len(rollout.completion_ids) <= 3 and rollout.truncated is None
    assert any(r.completion_ids[-1] != tokenizer.eos_token_id for r in out.values())  # some were cut at the limit


def test_structured_outputs_constrain_every_sample(real_vllm, tokenizer):
    eng = VLLMServerEngine([real_vllm.url], tokenizer,
                           SamplingParams(max_new_tokens=8, eos_token_ids=(tokenizer.eos_token_id,)),
                           startup_timeout=30.0, request_fields={"structured_outputs": {"regex": "[0-9]{3}"}})
    try:
        out = sample(eng, requests(tokenizer))
    finally:
        eng.close()
    for rollout in out.values():
        text = tokenizer.decode([t for t in rollout.completion_ids if t != tokenizer.eos_token_id])
        assert re.fullmatch("[0-9]{3}", text), text


def test_a_prompt_longer_than_the_context_fails_with_vllms_reason(real_vllm, tokenizer):
    eng = engine(real_vllm, tokenizer)
    try:
        too_long = RolloutRequest(index=0, group=0, prompt_ids=(5,) * 1100, seed=0)
        with pytest.raises(RolloutError, match="maximum context length is 1024 tokens"):
            eng.submit(too_long).result(timeout=120)
    finally:
        eng.close()


def _long_requests(tokenizer, n: int = 4) -> list[RolloutRequest]:
    return [RolloutRequest(index=i, group=0, prompt_ids=tuple(tokenizer("Count: 1, 2, 3,")["input_ids"]), seed=i)
            for i in range(n)]


def test_samples_the_server_aborts_are_refused_not_trained_on(real_vllm, tokenizer):
    """vLLM's `POST /pause?mode=abort` ends the requests in flight with finish_reason "abort": a cut-short sample."""
    eng = VLLMServerEngine([real_vllm.url], tokenizer, SamplingParams(max_new_tokens=900), startup_timeout=30.0,
                           request_fields={"ignore_eos": True})  # long enough to be in flight at any model
    try:
        futures = [eng.submit(r) for r in _long_requests(tokenizer)]
        time.sleep(1.0)
        assert http_call(real_vllm.url, "POST", "/pause?mode=abort", timeout=60).status == 200
        try:
            for future in futures:
                with pytest.raises(RolloutError, match="abort"):
                    future.result(timeout=120)
        finally:
            assert http_call(real_vllm.url, "POST", "/resume", timeout=60).status == 200
    finally:
        eng.close()


def test_closing_the_engine_aborts_its_requests_and_the_server_serves_on(real_vllm, tokenizer):
    eng = VLLMServerEngine([real_vllm.url], tokenizer, SamplingParams(max_new_tokens=900), startup_timeout=30.0,
                           request_fields={"ignore_eos": True})  # long enough to be in flight at any model
    futures = [eng.submit(r) for r in _long_requests(tokenizer)]
    time.sleep(1.0)
    started = time.monotonic()
    eng.close()
    for future in futures:
        with pytest.raises(Exception):  # noqa: B017  (EngineClosed or RolloutError: the run is over either way)
            future.result(timeout=60)
    assert time.monotonic() - started < 30
    again = engine(real_vllm, tokenizer)
    try:
        assert len(sample(again, requests(tokenizer)[:2])) == 2
    finally:
        again.close()
