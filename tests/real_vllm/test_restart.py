"""A real vLLM server restarted between two batches, under the same engine: the second batch waits for nothing, sees
the server's own weights again and samples exactly what the first sampled (seeds are per request). The restarted
server is TRL's own `trl vllm-serve` (TRL 1.16, from the same vLLM install), so every test after this one also runs
against the server TRL users start."""

from __future__ import annotations

from concurrent.futures import wait

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.real_vllm.conftest import learner_logprobs, restart_session_server, restore_base
from trl_thundersync.rollout.vllm_api import http_call
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.types import RolloutRequest, SamplingParams

PROMPTS = ("What is 2 + 3?", "def add(a, b):", "$ pytest -q", "Count: 1, 2,")


def prompt_ids(tokenizer, index: int) -> tuple[int, ...]:
    return tuple(tokenizer(PROMPTS[index % 4])["input_ids"])


def batch(engine: VLLMServerEngine, tokenizer) -> dict[int, tuple[tuple[int, ...], tuple[float, ...]]]:
    requests = [RolloutRequest(index=i, group=i // 2, prompt_ids=prompt_ids(tokenizer, i), seed=100 + i)
                for i in range(8)]
    futures = [engine.submit(r) for r in requests]
    wait(futures)
    return {f.result().index: (f.result().completion_ids, f.result().sampling_logprobs) for f in futures}


def test_a_restart_between_batches_gives_the_same_samples_and_trl_vllm_serve_is_a_drop_in(real_vllm, tmp_path):
    restore_base(real_vllm, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(real_vllm.model)
    sampling = SamplingParams(max_new_tokens=16, eos_token_ids=(tokenizer.eos_token_id,))
    engine = VLLMServerEngine([real_vllm.url], tokenizer, sampling, startup_timeout=30.0, restart_timeout=600.0)
    try:
        before = batch(engine, tokenizer)
        restarted = restart_session_server(real_vllm, serve_kwargs={"launcher": "trl"})
        assert "vllm-serve" in " ".join(restarted.process.args)
        after = batch(engine, tokenizer)
    finally:
        engine.close()
    assert {i: ids for i, (ids, _) in after.items()} == {i: ids for i, (ids, _) in before.items()}
    # each server against the folder's weights first, so a failure says which one is off (a CI run once had both
    # servers disagree by 2e-4: the restored session server, or the fresh `trl vllm-serve`?)
    learner = AutoModelForCausalLM.from_pretrained(real_vllm.model, dtype=torch.float32).eval()
    for name, served in (("the restored session server", before), ("the restarted trl vllm-serve", after)):
        errors = [learner_logprobs(learner, prompt_ids(tokenizer, i), ids) - torch.tensor(logprobs)
                  for i, (ids, logprobs) in served.items()]
        worst = max(e.abs().max().item() for e in errors)
        assert worst <= 1e-5, f"{name}'s log-probs are {worst:.2e} off the folder's FP32 weights"
    for i, (_, logprobs) in after.items():
        assert max(abs(a - b) for a, b in zip(logprobs, before[i][1], strict=True)) <= 1e-6
    assert http_call(real_vllm.url, "GET", "/weight_info", timeout=30).json()["weight_version"] == "default"
