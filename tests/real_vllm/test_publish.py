"""Weight publication to a real `vllm serve` (issue 24 items 4, 5): full weights without NCCL (`"reload"`, which
`"auto"` picks on CPU) give log-probs equal to the learner's and a `/weight_info` label naming the version; a server
that lost the version (restarted: its checkpoint, label "default") gets it again before the batch; LoRA adapters
refuse a base another run replaced, and sample like the PEFT learner on the server's own base.

Every test leaves the session server as it found it: its own weights (tied `lm_head` written out) and label.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.real_vllm.conftest import learner_logprobs
from trl_thundersync.errors import ServerBaseWeightsError
from trl_thundersync.rollout.server_acks import confirm_all, read_weight_version, set_weight_version
from trl_thundersync.rollout.vllm_api import http_call
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.rollout.vllm_publish import LoRAAdapterPublisher
from trl_thundersync.rollout.vllm_reload import CheckpointReloadPublisher
from trl_thundersync.types import RolloutRequest, SamplingParams

PROMPTS = ("What is 2 + 3?", "Count the letters in banana.", "def add(a, b):", "$ pytest -q")
TOLERANCE = 1e-5  # FP32 on both sides; measured ≤ 1e-6 here


@pytest.fixture(scope="module")
def tokenizer(real_vllm):
    return AutoTokenizer.from_pretrained(real_vllm.model)


def served_model(real_vllm):
    return AutoModelForCausalLM.from_pretrained(real_vllm.model, dtype=torch.float32).eval()


def perturbed(model, seed: int, scale: float = 0.05):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)
    return model


@pytest.fixture
def restored(real_vllm):
    """After the test: the served model's own weights and the label "default", as the server started."""
    yield
    publisher = CheckpointReloadPublisher(run_id="restore", check_content=False)
    try:
        publisher.prepare(served_model(real_vllm), 0)
        publisher.push(real_vllm.url, 0)
    finally:
        publisher.close()
    set_weight_version(real_vllm.url, "default", 60.0)


def requests(tokenizer) -> list[RolloutRequest]:
    ids = [tuple(tokenizer(p)["input_ids"]) for p in PROMPTS]
    return [RolloutRequest(index=i, group=i // 2, prompt_ids=ids[i % len(ids)], seed=31 + i) for i in range(8)]


def engine(real_vllm, tokenizer, publisher) -> VLLMServerEngine:
    params = SamplingParams(max_new_tokens=12, eos_token_ids=(tokenizer.eos_token_id,),
                            pad_token_id=tokenizer.pad_token_id)
    return VLLMServerEngine([real_vllm.url], tokenizer, params, publisher=publisher, startup_timeout=30.0)


def largest_logprob_error(eng: VLLMServerEngine, learner, reqs) -> float:
    """max |vLLM's log-prob - the learner's| over every sampled token (temperature 1: the model's distribution)."""
    worst = 0.0
    for future in [eng.submit(r) for r in reqs]:
        rollout = future.result(timeout=120)
        ours = learner_logprobs(learner, rollout.prompt_ids, rollout.completion_ids)
        worst = max(worst, (ours - torch.tensor(rollout.sampling_logprobs)).abs().max().item())
    return worst


def served_prompt_logprobs(url: str, model: str, ids: list[int]) -> torch.Tensor:
    reply = http_call(url, "POST", "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1,
                                                       "temperature": 1.0, "prompt_logprobs": 0}, timeout=120)
    assert reply.status == 200, reply.body
    entries = reply.json()["choices"][0]["prompt_logprobs"]
    return torch.tensor([entries[i][str(ids[i])]["logprob"] for i in range(1, len(ids))])


def learner_prompt_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_full_weights_reach_vllm_by_checkpoint_reload_with_the_learners_logprobs(real_vllm, tokenizer, restored,
                                                                                 caplog):
    learner, reqs = served_model(real_vllm), requests(tokenizer)
    with caplog.at_level(logging.INFO, logger="trl_thundersync.rollout"):
        eng = engine(real_vllm, tokenizer, "auto")  # CPU learner: 'auto' must pick 'reload', not NCCL
        try:
            assert "chose 'reload'" in caplog.text
            for version in (1, 2):
                before = largest_logprob_error(eng, perturbed(learner, version), reqs[:2])  # still the old weights
                seconds = eng.publish(learner, version)
                error = largest_logprob_error(eng, learner, reqs)
                label = read_weight_version(real_vllm.url, 30.0)
                print(f"version {version}: published in {seconds:.3f} s, max |Δ log-prob| {error:.2e}, {label}")
                assert error <= TOLERANCE, (version, error)
                assert re.fullmatch(rf"policy-[0-9a-f]{{8}}-v{version}", label), label
                assert before > 100 * TOLERANCE, before  # the perturbation is visible: the reload changed weights
        finally:
            eng.close()
    told = [r.getMessage() for r in caplog.records if "confirmed by hash" in r.getMessage()]
    assert len(told) == 1 and "hashed as empty" in told[0], told  # CPU: linear layers repacked, said once
    hashed = int(re.search(r"(\d+) parameter\(s\) confirmed by hash", told[0]).group(1))
    assert hashed >= 1, told[0]  # embeddings and norms: vLLM's digests equal the checkpoint's, byte for byte


def test_a_replica_that_lost_the_version_is_reloaded_before_the_batch(real_vllm, restored):
    learner = perturbed(served_model(real_vllm), 3)
    ids = [5, 17, 33, 80, 100, 7, 9, 250, 3, 44]
    publisher = CheckpointReloadPublisher()
    try:
        publisher.prepare(learner, 7)
        publisher.push(real_vllm.url, 7)
        expected = learner_prompt_logprobs(learner, ids)
        assert (served_prompt_logprobs(real_vllm.url, real_vllm.model, ids) - expected).abs().max() <= TOLERANCE
        put_back = CheckpointReloadPublisher(run_id="restart", check_content=False)  # as after a restart:
        put_back.prepare(served_model(real_vllm), 0)                                # its checkpoint, "default"
        put_back.push(real_vllm.url, 0)
        put_back.close()
        set_weight_version(real_vllm.url, "default", 60.0)
        assert "reports weight version 'default'" in publisher.confirm(real_vllm.url, 7)
        confirm_all([real_vllm.url], publisher, 7)  # restore: version 7 reloaded from its folder
        assert read_weight_version(real_vllm.url, 30.0) == f"{publisher.prefix}-v7"
        assert (served_prompt_logprobs(real_vllm.url, real_vllm.model, ids) - expected).abs().max() <= TOLERANCE
    finally:
        publisher.close()


def test_lora_refuses_a_replaced_base_and_samples_like_the_learner_on_its_own(real_vllm, tokenizer, restored):
    from peft import LoraConfig, get_peft_model

    full = CheckpointReloadPublisher(run_id="0123abcd")
    full.prepare(perturbed(served_model(real_vllm), 4), 2)
    full.push(real_vllm.url, 2)  # what a full-weight run leaves on a long-lived server
    full.close()
    policy = get_peft_model(served_model(real_vllm), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    refused = LoRAAdapterPublisher()
    refused.prepare(policy, 0)
    with pytest.raises(ServerBaseWeightsError, match="labelled 'policy-0123abcd-v2'") as caught:
        refused.push(real_vllm.url, 0)
    assert caught.value.label == "policy-0123abcd-v2"
    refused.close()

    base = CheckpointReloadPublisher(run_id="base", check_content=False)  # as after a restart: its own base again
    base.prepare(served_model(real_vllm), 0)
    base.push(real_vllm.url, 0)
    base.close()
    set_weight_version(real_vllm.url, "default", 60.0)
    eng = engine(real_vllm, tokenizer, "lora")
    try:
        eng.publish(policy, 1)
        error = largest_logprob_error(eng, policy.eval(), requests(tokenizer))
        print(f"LoRA on the server's own base: max |Δ log-prob| {error:.2e}")
        assert error <= TOLERANCE
        assert read_weight_version(real_vllm.url, 30.0) == "default"  # adapters leave the base label alone
    finally:
        eng.close()
