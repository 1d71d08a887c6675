"""A rollout server that outlives its trainer (issue 14 items 1–3), against the embedded server made as strict as
vLLM 0.27 on the publication routes: adapter names unique per run and unloaded at close (a second run and a
resume_from_checkpoint on the same server), vLLM's refusals (a loaded name, a folder without an adapter), the weight
version it confirms, and a replica restarted between batches detected before the next batch.

The servers run on threads of the test process (`ServerThread`), so a "restart" is a new server on the same port
that serves the weights it was started with — what a supervisor restarting a crashed vLLM produces.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import pytest
import torch

from benchmarks.parity import cpu_config, load_model, prompt_dataset
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer
from trl_thundersync.errors import ReplicaRestartedError, RolloutError
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.rollout.vllm_publish import HTTPWeightFile, LoRAAdapterPublisher
from trl_thundersync.serve.app import EmbeddedServer, ServerThread
from trl_thundersync.types import RolloutRequest, SamplingParams

SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0)
LORA_TARGETS = ["q_proj", "v_proj"]


def _call(url: str, method: str, path: str, body=None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            raw = reply.read()
            status = reply.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def _peft(path: str, seed: int = 0):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_model(path), LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                                        lora_dropout=0.0))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def server(tiny_model_path):
    thread = ServerThread(EmbeddedServer(tiny_model_path, max_in_flight=8))
    yield thread
    thread.close()


def _requests(tokenizer, n: int = 4) -> list[RolloutRequest]:
    ids = tuple(tokenizer("The answer is")["input_ids"])
    return [RolloutRequest(index=i, group=i // 2, prompt_ids=ids, seed=100 + i) for i in range(n)]


def _batch(engine: VLLMServerEngine, tokenizer, version: int) -> list:
    engine.start_batch(_requests(tokenizer), policy_version=version)
    return list(engine.results())


def test_the_adapter_and_version_routes_refuse_what_vllm_refuses(server, tiny_model_path, tmp_path):
    adapter = tmp_path / "adapter"
    _peft(tiny_model_path).save_pretrained(str(adapter))
    load = {"lora_name": "a-v1", "lora_path": str(adapter)}
    assert _call(server.url, "POST", "/v1/load_lora_adapter", load) == (
        200, "Success: LoRA adapter 'a-v1' added successfully.")
    status, body = _call(server.url, "POST", "/v1/load_lora_adapter", load)
    assert status == 400 and body["error"]["message"] == (
        "The lora adapter 'a-v1' has already been loaded. If you want to load the adapter in place, set "
        "'load_inplace' to True.")
    status, body = _call(server.url, "POST", "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "/tmp/nope/x"})
    assert status == 404 and body["error"] == {"message": "Loading lora b failed: No adapter found for <path>",
                                               "type": "NotFoundError", "param": None, "code": 404}
    assert _call(server.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "a-v1"})[0] == 200
    status, body = _call(server.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "a-v1"})
    assert status == 404 and body["error"]["message"] == "The lora adapter 'a-v1' cannot be found."
    assert _call(server.url, "GET", "/weight_info") == (200, {"weight_version": "default"})
    assert _call(server.url, "POST", "/update_weight_version", {"new_version": "run-v3"}) == (
        200, {"success": True, "new_version": "run-v3"})
    assert _call(server.url, "GET", "/weight_info") == (200, {"weight_version": "run-v3"})
    assert _call(server.url, "POST", "/update_weight_version", {"new_version": 3})[0] == 400
    assert _call(server.url, "POST", "/no_such_route", {}) == (404, {"detail": "Not Found"})  # FastAPI's answer
    _call(server.url, "POST", "/update_weight_version", {"new_version": "default"})  # LoRA tests check the base label


def test_an_adapter_folder_the_server_cannot_read_is_reported_with_its_own_text(server, tiny_model_path, tokenizer,
                                                                                 tmp_path):
    class ElsewhereOnDisk(LoRAAdapterPublisher):  # the trainer writes where the server's filesystem has nothing
        def prepare(self, model, version):
            super().prepare(model, version)
            shutil.rmtree(self._path)

    engine = VLLMServerEngine([server.url], tokenizer, SAMPLING, publisher=ElsewhereOnDisk(tmp_path / "local"))
    try:
        with pytest.raises(RolloutError, match=r"cannot read adapter 'policy-\w+-v1' at .*No adapter found for "
                                               r"<path>.*vllm_publish_dir") as caught:
            engine.publish(_peft(tiny_model_path), 1)
        assert "--enable-lora" not in str(caught.value)  # not mistaken for a server without LoRA loading
    finally:
        engine.close()


def test_two_engines_one_after_the_other_reuse_one_server_without_a_name_clash(server, tiny_model_path, tokenizer):
    policy = _peft(tiny_model_path)
    for _ in range(2):  # two runs over the same long-lived server, each publishing versions 0, 1, 2
        engine = VLLMServerEngine([server.url], tokenizer, SAMPLING, publisher="lora", publish_first=True)
        try:
            for version in range(3):
                engine.publish(policy, version)
                assert {r.policy_version for r in _batch(engine, tokenizer, version)} == {version}
            prefix = engine._publisher.prefix
            assert server.app.loop.adapters() == [f"{prefix}-v2"]
        finally:
            engine.close()
        assert server.app.loop.adapters() == []  # the last adapter was unloaded at close


def test_a_replica_restarted_between_batches_is_detected_before_the_next_one(tiny_model_path, tokenizer):
    class CannotRestore(HTTPWeightFile):
        def restore(self, url, version):
            return False  # like NCCL: the trainer cannot put the version back

    policy = load_model(tiny_model_path)
    for publisher, restorable in ((HTTPWeightFile(), True), (CannotRestore(), False)):
        thread = ServerThread(EmbeddedServer(tiny_model_path, max_in_flight=8))
        port = thread.http.server_address[1]
        engine = VLLMServerEngine([thread.url], tokenizer, SAMPLING, publisher=publisher)
        try:
            engine.publish(policy, 1)
            assert {r.policy_version for r in _batch(engine, tokenizer, 1)} == {1}
            engine.publish(policy, 2)
            thread.close()  # it crashes and its supervisor starts it again, reporting the version it was told to
            thread = ServerThread(EmbeddedServer(tiny_model_path, max_in_flight=8, policy_version=2), port=port)
            if restorable:
                assert {r.policy_version for r in _batch(engine, tokenizer, 2)} == {2}
                assert _call(thread.url, "GET", "/weight_info")[1] == {"weight_version": f"{publisher.prefix}-v2"}
            else:
                with pytest.raises(ReplicaRestartedError, match=f"{thread.url} reports weight version 'default'"):
                    _batch(engine, tokenizer, 2)
        finally:
            engine.close()
            thread.close()


def reward_digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) - len(c) / 16 for c in completions]


def _train(path, tokenizer, out, url, resume=None, **overrides):
    from peft import LoraConfig

    args = dict(max_completion_length=8, per_device_train_batch_size=4, num_generations=2, max_steps=2,
                optim="sgd", learning_rate=0.5, rollout_max_in_flight=4, rollout_engine="embedded_server",
                vllm_server_base_urls=[url], vllm_weight_publisher="lora")
    args.update(overrides)
    trainer = ThunderSyncGRPOTrainer(model=load_model(path), reward_funcs=[reward_digits],
                                     args=cpu_config(ThunderSyncGRPOConfig, out, **args),
                                     train_dataset=prompt_dataset(16), processing_class=tokenizer,
                                     peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                                            lora_dropout=0.0))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.mark.slow
def test_a_second_run_resumed_from_a_checkpoint_reuses_the_server_of_the_first(server, tiny_model_path, tokenizer,
                                                                               tmp_path):
    first = _train(tiny_model_path, tokenizer, tmp_path, server.url, save_strategy="steps", save_steps=2)
    assert first.policy_version == 2 and server.app.loop.adapters() == []  # its last adapter unloaded at close
    resumed = _train(tiny_model_path, tokenizer, tmp_path, server.url, resume=str(tmp_path / "checkpoint-2"),
                     max_steps=3)
    assert resumed.policy_version == 3 and server.app.loop.adapters() == []
    versions = [h["rollout/replica0/policy_version"] for h in resumed.state.log_history
                if "rollout/replica0/policy_version" in h]
    assert versions == [0.0, 1.0, 2.0]  # the checkpoint's history, then the resumed batch at version 2
