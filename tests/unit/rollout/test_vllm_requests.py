"""The request side against a stub vLLM server: TRL's generation fields forwarded (or refused by name), the server's
log-prob mode and batch size read from `/server_info`, aborted samples refused, HTTP 500 resent as TRL's client does,
the teacher's tokenizer probed.

The stub answers like `vllm serve` (no policy-version header; `/version`, `/server_info` and `/tokenize` as
configured), records every completion body, and plays a script of statuses / finish reasons.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace

import pytest

from tests.fixtures import http_stub
from trl_thundersync.distill.teacher_server import ServerTeacher
from trl_thundersync.errors import (
    AbortedSampleError,
    ConfigurationError,
    RolloutError,
    UnsupportedOptionError,
    VocabularyMismatchError,
)
from trl_thundersync.rollout import vllm_api, vllm_client
from trl_thundersync.rollout.request_fields import request_fields
from trl_thundersync.rollout.server_info import VLLM_DEFAULT_MAX_NUM_SEQS
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.serve import protocol
from trl_thundersync.trainers.grpo.checks import refuse_dropped_generation_fields
from trl_thundersync.types import RolloutRequest, SamplingParams

DEFAULT = SamplingParams(max_new_tokens=4)  # temperature 1, no top-k/p: raw log-probs are the sampler's
TEMPERED = SamplingParams(max_new_tokens=4, temperature=0.7)
PROBE_IDS = [11, 12, 13]


class FakeTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(PROBE_IDS)}


class VLLMStub:
    """`info`: the /server_info `vllm_config` (None: 404, vLLM without dev mode); `release`: /version (None: 404);
    `script`: per completion, an HTTP status or a finish_reason, then "stop" answers."""

    def __init__(self, *, info=None, release="0.31.0", script=(), tokens=PROBE_IDS) -> None:
        self.bodies: list[dict] = []
        self.script, self.lock = list(script), threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                path = self.path.split("?")[0]
                if path == "/health":
                    self._send(200, None)
                elif path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "base", "object": "model"}]})
                elif path == "/version" and release is not None:
                    self._send(200, {"version": release})
                elif path == "/server_info" and info is not None:
                    self._send(200, {"vllm_config": info, "vllm_env": {}, "system_env": {}})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    self._send(200, {"count": len(tokens), "max_model_len": 64, "tokens": tokens, "token_strs": None})
                    return
                with stub.lock:
                    stub.bodies.append(body)
                    step = stub.script.pop(0) if stub.script else "stop"
                if isinstance(step, int):
                    self._send(step, {"error": {"message": f"status {step}", "type": "InternalServerError",
                                                "param": None, "code": step}})
                    return
                self._send(200, {"model": "base", "choices": [{
                    "index": 0, "text": "", "token_ids": [5, 6], "prompt_token_ids": body["prompt"],
                    "logprobs": {"token_logprobs": [-0.5, -0.25], "tokens": ["token_id:5", "token_id:6"]},
                    "finish_reason": step}]})

            def _send(self, status, payload):
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http, self.url = http_stub.start(Handler)


@pytest.fixture
def vllm():
    started: list[VLLMStub] = []

    def start(**kwargs) -> VLLMStub:
        started.append(VLLMStub(**kwargs))
        return started[-1]

    yield start
    for stub in started:
        http_stub.stop(stub.http)


class NullPublisher:
    lora, concurrent = False, True

    def prepare(self, model, version): ...
    def push(self, url, version): ...
    def retire(self, urls, previous_version): ...
    def restore(self, url, version): return True
    def close(self): ...


def engine(urls, sampling=DEFAULT, **kwargs) -> VLLMServerEngine:
    return VLLMServerEngine(urls, FakeTokenizer(), sampling, publisher=NullPublisher(), startup_timeout=5.0, **kwargs)


def one_sample(eng: VLLMServerEngine):
    eng.start_batch([RolloutRequest(index=0, group=0, prompt_ids=(1, 2, 3), seed=7)], policy_version=0)
    return list(eng.results())


def info(mode="processed_logprobs", seqs=None):
    return {"model_config": {"logprobs_mode": mode}, "scheduler_config": {"max_num_seqs": seqs},
            "weight_transfer_config": {"backend": "nccl"}}


# -- generation_kwargs / vllm_structured_outputs_regex -------------------------------------------------------------
def test_trl_generation_fields_map_to_request_fields_as_trls_server_client_does():
    assert request_fields({"presence_penalty": 0.5, "stop": ["\n\n"]}, r"\d+") == {
        "presence_penalty": 0.5, "stop": ["\n\n"], "structured_outputs": {"regex": r"\d+"}}
    assert request_fields(None, None) == {}


@pytest.mark.parametrize("kwargs, regex, match", [
    ({"best_of": 2}, None, r"\['best_of'\] are not fields of vLLM"),  # vLLM would ignore it silently
    ({"guided_decoding": {"regex": "a"}}, None, "guided_decoding"),
    ({"temperature": 0.5}, None, "'temperature' .*set temperature"),
    ({"seed": 1, "logprobs": 5}, None, "'logprobs'.*'seed'"),
    ({"structured_outputs": {"json": {}}}, r"\d+", "both set"),
])
def test_fields_vllm_would_drop_or_the_engine_owns_are_refused_by_name(kwargs, regex, match):
    with pytest.raises(ConfigurationError, match=match):
        request_fields(kwargs, regex)


def test_the_engine_sends_the_fields_in_every_request(vllm):
    stub = vllm(info=info())
    fields = request_fields({"presence_penalty": 0.5}, r"[0-9]+")
    eng = engine([stub.url], request_fields=fields)
    try:
        one_sample(eng)
    finally:
        eng.close()
    assert stub.bodies[0]["presence_penalty"] == 0.5
    assert stub.bodies[0]["structured_outputs"] == {"regex": "[0-9]+"}
    assert stub.bodies[0]["seed"] == 7 and stub.bodies[0]["logprobs"] == 0  # the engine's own fields kept


def test_a_field_newer_than_the_servers_release_is_refused(vllm):
    stub = vllm(release="0.22.0")
    with pytest.raises(ConfigurationError, match=r"vLLM 0\.22\.0.*'bad_words' \(vLLM >= 0\.26\)"):
        engine([stub.url], request_fields={"bad_words": ["x"]})


def _checked(engine_kind, **fields):
    return _args(engine_kind, **fields), False  # (args, uses_trl_generation)


def _args(engine_kind, **fields):
    fields = {"generation_kwargs": None, "vllm_structured_outputs_regex": None, **fields}
    fields = {"loss_type": "grpo", "vllm_importance_sampling_correction": True, **fields}
    args = SimpleNamespace(**fields, resolved_rollout_engine=lambda _: engine_kind,
                           samples_from_vllm=lambda: engine_kind in ("vllm_server", "managed_vllm"))
    return args


def test_the_trainer_checks_the_fields_for_vllm_and_refuses_them_for_the_embedded_engines():
    refuse_dropped_generation_fields(*_checked("vllm_server", generation_kwargs={"min_tokens": 2}))  # forwarded
    refuse_dropped_generation_fields(*_checked("managed_vllm", generation_kwargs={"min_tokens": 2}))  # real vLLM too
    with pytest.raises(UnsupportedOptionError, match="loss_type='vespo' and rollout_engine='managed_vllm'"):
        refuse_dropped_generation_fields(*_checked("managed_vllm", loss_type="vespo"))
    with pytest.raises(ConfigurationError, match="best_of"):
        refuse_dropped_generation_fields(*_checked("vllm_server", generation_kwargs={"best_of": 2}))
    for kind in ("local_process", "embedded_server"):
        with pytest.raises(UnsupportedOptionError, match="vllm_structured_outputs_regex"):
            refuse_dropped_generation_fields(*_checked(kind, vllm_structured_outputs_regex="a+"))


def test_rollout_setup_hands_the_fields_and_the_correction_to_the_engine(monkeypatch, tmp_path):
    import torch

    from benchmarks.parity import cpu_config
    from trl_thundersync import ThunderSyncGRPOConfig
    from trl_thundersync.trainers.rollout_setup import RolloutTarget, build_turn_generator

    built = {}

    class Recorder:
        def __init__(self, urls, tokenizer, sampling, **kwargs):
            built.update(kwargs, urls=urls)

        def publish(self, model, version):
            return 0.0

    monkeypatch.setattr(vllm_client, "VLLMServerEngine", Recorder)
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path, use_vllm=True, vllm_mode="server",
                      vllm_server_base_urls=["http://10.0.0.5:8000", "http://10.0.0.6:8000"],
                      generation_kwargs={"frequency_penalty": 0.2}, vllm_structured_outputs_regex="[ab]+")
    target = RolloutTarget(torch.nn.Linear(1, 1), None, torch.device("cpu"), 1, 0)
    build_turn_generator(target, args, DEFAULT, on_metric=lambda *_: None)
    assert built["request_fields"] == {"frequency_penalty": 0.2, "structured_outputs": {"regex": "[ab]+"}}
    assert built["importance_sampling"] is True  # TRL's default vllm_importance_sampling_correction
    assert built["max_concurrency"] is None  # rollout_max_in_flight unset: from the servers' max_num_seqs


# -- logprobs_mode -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, sampling, fields, refused", [
    ("raw_logprobs", TEMPERED, {}, "temperature=0.7"),
    ("raw_logprobs", DEFAULT, {"presence_penalty": 0.5}, "presence_penalty=0.5"),
    ("raw_logits", DEFAULT, {}, "logits, not log-probs"),
    ("raw_logprobs", DEFAULT, {"user": "me"}, None),  # default sampling: raw == processed
    ("processed_logprobs", TEMPERED, {"presence_penalty": 0.5}, None),
])
def test_a_server_whose_logprobs_would_bias_the_correction_is_refused(vllm, mode, sampling, fields, refused):
    stub = vllm(info=info(mode))
    if refused is None:
        engine([stub.url], sampling, request_fields=fields, importance_sampling=True).close()
        return
    with pytest.raises(ConfigurationError, match=f"--logprobs-mode {mode}.*{refused}"):
        engine([stub.url], sampling, request_fields=fields, importance_sampling=True)
    engine([stub.url], sampling, request_fields=fields, importance_sampling=False).close()  # no correction: fine


def test_a_server_without_server_info_is_warned_about_not_refused(vllm, caplog):
    stub = vllm(info=None)
    with caplog.at_level(logging.WARNING):
        engine([stub.url], TEMPERED, importance_sampling=True).close()
    assert "does not report its --logprobs-mode" in caplog.text


# -- concurrency from the servers' limits ------------------------------------------------------------------------
def test_the_default_concurrency_is_each_servers_max_num_seqs(vllm):
    reported, silent = vllm(info=info(seqs=48)), vllm(info=None)
    eng = engine([reported.url, silent.url])
    try:
        assert eng.max_concurrency == 48 + VLLM_DEFAULT_MAX_NUM_SEQS
        assert eng._pool._max_workers == eng.max_concurrency
    finally:
        eng.close()
    eng = engine([reported.url], max_concurrency=5)
    assert eng.max_concurrency == 5
    eng.close()


# -- finish_reason and HTTP 500 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("reason", ["abort", "error"])
def test_an_aborted_sample_is_refused(vllm, reason):
    stub = vllm(script=[reason])
    eng = engine([stub.url])
    try:
        with pytest.raises(AbortedSampleError, match=f"finish_reason='{reason}'"):
            one_sample(eng)
    finally:
        eng.close()


def test_http_500_is_sent_again_with_backoff_and_bounded(vllm, monkeypatch):
    monkeypatch.setattr(vllm_api, "RESEND_BACKOFF_S", 0.02)
    stub = vllm(script=[500, 500])
    eng = engine([stub.url], retries=3)
    pauses, wait = [], eng._cancel.wait
    eng._cancel.wait = lambda seconds: (pauses.append(seconds), wait(seconds))[1]
    try:
        rollouts = one_sample(eng)
    finally:
        eng.close()
    assert len(stub.bodies) == 3 and rollouts[0].completion_ids == (5, 6)
    assert pauses == [0.0, 0.04]  # urllib3's schedule for TRL's backoff_factor (0, 2f, 4f, ...), f = 0.02 here
    assert stub.bodies[0] == stub.bodies[2]  # the same request, seed included: the same sample

    stub = vllm(script=[500] * 10)
    eng = engine([stub.url], retries=2)
    try:
        with pytest.raises(RolloutError, match="failed 3 times; last error: HTTP 500"):
            one_sample(eng)
    finally:
        eng.close()
    assert len(stub.bodies) == 3


def test_http_400_is_not_retried(vllm):
    stub = vllm(script=[400])
    eng = engine([stub.url])
    try:
        with pytest.raises(RolloutError, match="refused the request: HTTP 400"):
            one_sample(eng)
    finally:
        eng.close()
    assert len(stub.bodies) == 1


# -- the teacher's tokenizer ---------------------------------------------------------------------------------------
def test_the_teacher_server_gets_the_same_tokenizer_probe(vllm):
    ServerTeacher(vllm().url, tokenizer=FakeTokenizer())  # same split: accepted
    with pytest.raises(VocabularyMismatchError, match="teacher server .* splits text differently"):
        ServerTeacher(vllm(tokens=[11, 99]).url, tokenizer=FakeTokenizer())


# -- the embedded server: what it implements, ignores and refuses ------------------------------------------------
SERVED = protocol.ServedModel(name="base", vocab_size=32, max_model_len=64, eos_token_ids=frozenset({2}))


@pytest.mark.parametrize("name, value", [("include_stop_str_in_output", True), ("truncate_prompt_tokens", 2),
                                         ("thinking_token_budget", 8), ("vllm_xargs", {"a": 1}),
                                         ("structured_outputs", {"regex": "a"}), ("presence_penalty", 0.5)])
def test_the_embedded_server_refuses_vllm_fields_it_does_not_implement(name, value):
    with pytest.raises(protocol.APIError, match=f"`{name}` is not supported") as raised:
        protocol.parse_completion_request({"prompt": [1, 2], name: value}, SERVED, ())
    assert raised.value.status == 400 and raised.value.param == name


def test_the_embedded_server_ignores_neutral_and_unknown_fields_as_vllm_does():
    call = protocol.parse_completion_request({"prompt": [1, 2], "priority": 3, "user": "u", "cache_salt": "s",
                                              "not_a_vllm_field": 1, "include_stop_str_in_output": False}, SERVED, ())
    assert call.prompts == ((1, 2),)


def test_the_embedded_server_reports_processed_logprobs_and_its_batch_size():
    body = protocol.server_info_response(SERVED, max_num_seqs=6)["vllm_config"]
    assert body["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert body["scheduler_config"]["max_num_seqs"] == 6 and body["weight_transfer_config"] is None
