"""A real vLLM server whose engine core dies: the batch fails within seconds naming vLLM's message, not after the
client waited `restart_timeout` (300 s) for a restart that never comes.

The model has head size 16, which vLLM 0.32's CPU attention does not support: the server starts, and the first
forward kills its engine (`Unsupported CPU attention configuration: head_dim=16` in its log); vLLM then answers HTTP
500 `EngineCore encountered an issue ...` and exits. On a GPU build head size 16 is served, so the test is CPU-only.
The stub version (and a restart that is waited for): `tests/unit/test_dead_engine.py`.
"""

from __future__ import annotations

import time

import pytest

from trl_thundersync.rollout.vllm_api import DeadEngineError
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.types import RolloutRequest, SamplingParams

DEADLINE_S = 30.0  # the bound; measured here: 0.1 s from the first request (the client waited 300 s before)


class NoPublisher:
    """Nothing is published: the batch runs at the server's own weights."""

    lora, concurrent = False, True

    def prepare(self, model, version): ...
    def push(self, url, version): ...
    def retire(self, urls, previous_version): ...
    def restore(self, url, version): return True
    def close(self): ...


@pytest.fixture(scope="module")
def head_size_16_model(tmp_path_factory) -> str:
    """A tiny Qwen3 with 4 heads of 16 (the shape the tiny builders had before vLLM was tested), built explicitly so
    that it does not follow the builders' shapes."""
    from transformers import Qwen3Config

    from trl_thundersync.tiny.model import build_tiny_tokenizer, model_from_config

    path = tmp_path_factory.mktemp("head16") / "tiny-head16"
    tokenizer = build_tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    tokenizer.save_pretrained(path)
    model_from_config(config, tokenizer, seed=0).save_pretrained(path)
    return str(path)


def test_a_dead_engine_fails_the_batch_within_seconds_naming_vllms_error(vllm_install, start_server,
                                                                         head_size_16_model):
    if not vllm_install.cpu:
        pytest.skip("a GPU build of vLLM serves head size 16; the engine only dies on vLLM's CPU attention")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(head_size_16_model)
    server = start_server(head_size_16_model, serve_kwargs={"enable_lora": False})
    engine = VLLMServerEngine([server.url], tokenizer, SamplingParams(max_new_tokens=8,
                                                                      eos_token_ids=(tokenizer.eos_token_id,)),
                              publisher=NoPublisher(), restart_timeout=300.0)
    try:
        start = time.perf_counter()
        with pytest.raises(DeadEngineError, match="EngineCore encountered an issue") as failure:
            engine.start_batch([RolloutRequest(index=i, group=0, prompt_ids=(5, 6, 7), seed=i) for i in range(4)],
                               policy_version=0)
            list(engine.results())
        elapsed = time.perf_counter() - start
    finally:
        engine.close()
    assert elapsed < DEADLINE_S, elapsed
    assert server.url in str(failure.value) and "server's log" in str(failure.value)
    server.process.wait(DEADLINE_S)  # vLLM's API server shuts down after a dead-engine answer
    log = server.log_path.read_text(errors="replace")
    assert "Unsupported CPU attention configuration: head_dim=16" in log  # the cause, where the message points
