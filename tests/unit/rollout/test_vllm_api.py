"""The vLLM wire format, without a server: request bodies, recorded vLLM answers, error shapes, publishers' calls.

The recorded answers are written from vLLM's OpenAI-compatible server documentation and protocol classes
(`CompletionResponse`, `CompletionLogProbs`, `ModelList`, `ErrorResponse`; vLLM >= 0.10.2 for `return_token_ids`),
so the production path is covered even though vLLM cannot run here.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from trl_thundersync.errors import ConfigurationError, RolloutError
from trl_thundersync.rollout.publisher_choice import make_publisher
from trl_thundersync.rollout.vllm_api import (
    HTTPReply,
    completion_payload,
    error_message,
    lora_name,
    lora_version,
    parse_completion,
    parse_max_model_len,
    parse_model_ids,
)
from trl_thundersync.rollout.vllm_publish import HTTPWeightFile, LoRAAdapterPublisher, TRLNCCLPublisher
from trl_thundersync.rollout.vllm_replicas import percentile
from trl_thundersync.serve.generation import GenerationOutput, PromptPosition
from trl_thundersync.serve.protocol import APIError, ServedModel, completion_response, parse_completion_request
from trl_thundersync.types import SamplingParams

# POST /v1/completions {"prompt": [151644, 872, 198], "max_tokens": 4, "logprobs": 0, "return_token_ids": true,
# "return_tokens_as_token_ids": true, "stop_token_ids": [151645], "ignore_eos": true, "seed": 7, ...}
RECORDED_COMPLETION = """{
  "id": "cmpl-3f1c9a6e2b8d4c47a1f0e5d6c7b8a9f0",
  "object": "text_completion",
  "created": 1767225600,
  "model": "Qwen/Qwen3-0.6B",
  "choices": [{
    "index": 0,
    "text": "Hello there<|im_end|>",
    "logprobs": {
      "text_offset": [0, 5, 11],
      "token_logprobs": [-0.3125, -1.75, -0.0625],
      "tokens": ["token_id:9707", "token_id:1052", "token_id:151645"],
      "top_logprobs": [{"token_id:9707": -0.3125}, {"token_id:1052": -1.75}, {"token_id:151645": -0.0625}]
    },
    "finish_reason": "stop",
    "stop_reason": 151645,
    "token_ids": [9707, 1052, 151645],
    "prompt_logprobs": null,
    "prompt_token_ids": [151644, 872, 198]
  }],
  "usage": {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3, "prompt_tokens_details": null},
  "system_fingerprint": null
}"""

# GET /v1/models on `vllm serve Qwen/Qwen3-0.6B --enable-lora` after POST /v1/load_lora_adapter {"lora_name":
# "policy-v3", "lora_path": "/ckpt/policy-v3"}
RECORDED_MODELS = """{
  "object": "list",
  "data": [
    {"id": "Qwen/Qwen3-0.6B", "object": "model", "created": 1767225600, "owned_by": "vllm",
     "root": "Qwen/Qwen3-0.6B", "parent": null, "max_model_len": 40960, "permission": []},
    {"id": "policy-v3", "object": "model", "created": 1767225600, "owned_by": "vllm", "root": "/ckpt/policy-v3",
     "parent": "Qwen/Qwen3-0.6B", "max_model_len": null, "permission": []}
  ]
}"""

SAMPLING = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05,
                          repetition_penalty=1.1, eos_token_ids=(151645, 151643))


def _reply(status: int, body: str, **headers: str) -> HTTPReply:
    return HTTPReply(status, {k.replace("_", "-"): v for k, v in headers.items()}, body.encode())


def test_completion_payload_asks_for_token_ids_processed_logprobs_and_the_seed():
    payload = completion_payload("policy-v3", (151644, 872, 198), SAMPLING, max_tokens=8, seed=12345)
    assert payload == {
        "model": "policy-v3", "prompt": [151644, 872, 198], "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
        "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 12345, "logprobs": 0,
        "return_token_ids": True, "return_tokens_as_token_ids": True, "stop_token_ids": [151645, 151643],
        "ignore_eos": True, "skip_special_tokens": False, "n": 1, "stream": False,
    }
    json.dumps(payload)  # plain JSON types only


def test_recorded_completion_parses_to_tokens_and_logprobs():
    completion = parse_completion(json.loads(RECORDED_COMPLETION))
    assert completion.model == "Qwen/Qwen3-0.6B"
    assert completion.prompt_ids == (151644, 872, 198)
    assert completion.token_ids == (9707, 1052, 151645)
    assert completion.logprobs == (-0.3125, -1.75, -0.0625)
    assert completion.finish_reason == "stop"


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("token_ids"), "vLLM >= 0.10.2"),
    (lambda c: c.update(logprobs=None), "no log-probs"),
    (lambda c: c["logprobs"]["token_logprobs"].pop(), "3 token ids but 2 log-probs"),
    (lambda c: c["logprobs"]["tokens"].__setitem__(1, "token_id:5"), "entry 1 is for 'token_id:5'"),
    (lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, None), "missing or NaN"),
])
def test_malformed_completions_are_refused_with_the_reason(edit, message):
    body = json.loads(RECORDED_COMPLETION)
    edit(body["choices"][0])
    with pytest.raises(RolloutError, match=message):
        parse_completion(body)


def test_more_than_one_choice_is_refused():
    body = json.loads(RECORDED_COMPLETION)
    body["choices"].append(body["choices"][0])
    with pytest.raises(RolloutError, match="exactly one choice"):
        parse_completion(body)


@pytest.mark.parametrize("status, body, expected", [
    (400, '{"error": {"message": "max_tokens must be at least 1, got 0.", "type": "BadRequestError", "param": null,'
          ' "code": 400}}', "BadRequestError: max_tokens must be at least 1, got 0."),  # vLLM >= 0.9
    (404, '{"object": "error", "message": "The model `policy-v9` does not exist.", "type": "NotFoundError", '
          '"param": null, "code": 404}', "NotFoundError: The model `policy-v9` does not exist."),  # older vLLM
    (404, '{"detail": "Not Found"}', "Not Found"),  # FastAPI: route absent (e.g. no VLLM_SERVER_DEV_MODE)
    (500, "Internal Server Error", "Internal Server Error"),
])
def test_error_messages_in_every_shape_vllm_uses(status, body, expected):
    assert error_message(_reply(status, body)) == expected


def test_recorded_model_list_and_versioned_adapter_names():
    ids = parse_model_ids(json.loads(RECORDED_MODELS))
    assert ids == ["Qwen/Qwen3-0.6B", "policy-v3"]
    assert parse_max_model_len(json.loads(RECORDED_MODELS)) == 40960  # the base model's window, not the adapter's
    assert parse_max_model_len({"object": "list", "data": [{"id": "m", "object": "model"}]}) is None
    assert lora_name("policy", 3) == "policy-v3"
    assert [lora_version(name, "policy") for name in ids] == [None, 3]
    assert lora_version("policy-v3-old", "policy") is None


def test_policy_version_header_is_read_from_embedded_answers_only():
    assert _reply(200, "", x_thundersync_policy_version="4").policy_version == 4
    assert _reply(200, "").policy_version is None  # vLLM reports none


def test_the_embedded_server_accepts_the_client_payload_and_answers_in_vllm_shape():
    served = ServedModel(name="tiny", vocab_size=200_000, max_model_len=4096, eos_token_ids=frozenset({151643}))
    payload = completion_payload("tiny", (151644, 872, 198), SAMPLING, max_tokens=8, seed=99)
    call = parse_completion_request(payload, served, adapters=[])
    (request,) = call.requests
    assert request.seed == 99 and request.prompt_ids == (151644, 872, 198) and request.adapter is None
    assert request.sampling.eos_token_ids == (151643, 151645)  # ignore_eos: only stop_token_ids end a sequence
    assert request.sampling.max_new_tokens == 8 and request.sampling.top_k == 20
    output = GenerationOutput(token_ids=(9707, 151645), logprobs=(-0.5, -math.inf), top_logprobs=(),
                              finish_reason="stop", stop_reason=151645, policy_version=0, started=0.0, finished=1.0)
    body = json.loads(json.dumps(completion_response(call, [output], decode=None)))
    completion = parse_completion(body)
    assert completion.token_ids == (9707, 151645) and completion.logprobs == (-0.5, -9999.0)  # vLLM's clamp
    assert body["choices"][0]["stop_reason"] == 151645 and body["usage"]["completion_tokens"] == 2

    # TRL's own client parses the same answer (it is what `trl vllm-serve` users already run).
    from trl.generation.vllm_client import parse_logprobs

    logprobs, token_ids = parse_logprobs([body["choices"][0]["logprobs"]])
    assert token_ids == [[[9707], [151645]]] and logprobs == [[[-0.5], [-9999.0]]]


@pytest.mark.parametrize("field, value", [("stream", True), ("stop", ["\n"]), ("presence_penalty", 0.5)])
def test_the_embedded_server_refuses_sampling_fields_it_does_not_implement(field, value):
    served = ServedModel(name="tiny", vocab_size=1000, max_model_len=64, eos_token_ids=frozenset())
    with pytest.raises(APIError, match=f"`{field}` is not supported"):
        parse_completion_request({"prompt": [1, 2], field: value}, served, adapters=[])


def test_unknown_models_answer_404_like_vllm():
    served = ServedModel(name="tiny", vocab_size=1000, max_model_len=64, eos_token_ids=frozenset())
    with pytest.raises(APIError) as info:
        parse_completion_request({"prompt": [1, 2], "model": "policy-v2"}, served, adapters=["policy-v1"])
    assert info.value.status == 404 and "policy-v2" in info.value.message


def test_prompt_logprobs_are_answered_in_vllm_shape_once_per_prompt():
    served = ServedModel(name="tiny", vocab_size=1000, max_model_len=64, eos_token_ids=frozenset(), max_logprobs=20)
    body = {"prompt": [[7, 8, 9], [4, 5]], "n": 2, "max_tokens": 1, "prompt_logprobs": 1}
    call = parse_completion_request(body, served, adapters=[])
    assert [r.prompt_logprobs for r in call.requests] == [1, None, 1, None]  # the first sample scores the prompt
    scored = (PromptPosition(token=8, logprob=-math.inf, rank=1000, top=((3, -0.25),)),
              PromptPosition(token=9, logprob=-0.125, rank=1, top=((9, -0.125),)))
    outputs = [GenerationOutput(token_ids=(1,), logprobs=(-1.0,), top_logprobs=(), finish_reason="length",
                                stop_reason=None, policy_version=0, started=0.0, finished=1.0, prompt_logprobs=p)
               for p in (scored, None, (PromptPosition(5, -2.0, 7, ((6, -0.5),)),), None)]
    answer = json.loads(json.dumps(completion_response(call, outputs, decode=None, token_text=lambda t: f"<{t}>")))
    first = [None, {"8": {"logprob": -9999.0, "rank": 1000, "decoded_token": "<8>"},  # vLLM clamps -inf
                    "3": {"logprob": -0.25, "rank": 1, "decoded_token": "<3>"}},
             {"9": {"logprob": -0.125, "rank": 1, "decoded_token": "<9>"}}]  # in the top: one entry
    choices = answer["choices"]
    assert choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"] == first
    assert choices[2]["prompt_logprobs"] == choices[3]["prompt_logprobs"] == [
        None, {"5": {"logprob": -2.0, "rank": 7, "decoded_token": "<5>"},
               "6": {"logprob": -0.5, "rank": 1, "decoded_token": "<6>"}}]
    plain = parse_completion_request({"prompt": [7, 8]}, served, adapters=[])
    assert plain.requests[0].prompt_logprobs is None
    assert completion_response(plain, outputs[1:2], decode=None)["choices"][0]["prompt_logprobs"] is None


@pytest.mark.parametrize("fields, message", [
    ({"prompt_logprobs": -2}, "`prompt_logprobs` must be a positive value or -1."),
    ({"prompt_logprobs": 21}, "Requested prompt logprobs of 21, which is greater than max allowed: 20"),
    ({"prompt_logprobs": -1}, "Requested prompt logprobs of 1000, which is greater than max allowed: 20"),
    ({"logprobs": 21}, "Requested sample logprobs of 21, which is greater than max allowed: 20"),
    ({"prompt_logprobs": True}, "`prompt_logprobs` must be a number"),
])
def test_log_prob_counts_vllm_refuses_are_400s(fields, message):
    served = ServedModel(name="tiny", vocab_size=1000, max_model_len=64, eos_token_ids=frozenset(), max_logprobs=20)
    with pytest.raises(APIError) as info:
        parse_completion_request({"prompt": [1, 2], **fields}, served, adapters=[])
    assert info.value.status == 400 and message in info.value.message and info.value.param == next(iter(fields))
    unlimited = ServedModel(name="tiny", vocab_size=1000, max_model_len=64, eos_token_ids=frozenset())
    assert parse_completion_request({"prompt": [1, 2], "prompt_logprobs": -1}, unlimited,
                                    adapters=[]).requests[0].prompt_logprobs == 1000  # -1 = the vocabulary


def test_publisher_selection():
    assert isinstance(make_publisher("auto", [0, 0]), HTTPWeightFile)  # embedded servers report a version
    assert isinstance(make_publisher("lora", [None]), LoRAAdapterPublisher)
    with pytest.raises(ConfigurationError, match="cannot mix"):
        make_publisher("auto", [0, None])
    with pytest.raises(ConfigurationError, match="not one of"):
        make_publisher("rsync", [0])


def test_nccl_without_vllm_installed_fails_with_the_install_hint():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigurationError, match=r'pip install "trl-thundersync\[vllm\]"'):
            make_publisher("nccl", [None, None], {"device": "cuda", "group_port": 51300})
    else:
        pytest.skip("vLLM is installed here")


class _FakeTRLClient:
    """Records what TRLNCCLPublisher asks of TRL's `VLLMClient` (the NCCL transfer itself needs GPUs)."""

    made: list[_FakeTRLClient] = []

    def __init__(self, base_url, group_port, connection_timeout):
        self.base_url, self.group_port, self.calls = base_url, group_port, []
        _FakeTRLClient.made.append(self)

    def init_communicator(self, device):
        self.calls.append(("init_communicator", str(device)))

    def update_named_params(self, metadata, named_params):
        sent = [(name, tuple(t.shape), t.dtype) for name, t in named_params]
        self.calls.append(("update_named_params", metadata, sent))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def close_communicator(self):
        self.calls.append(("close_communicator",))


def test_nccl_publisher_streams_every_parameter_then_resets_the_prefix_cache():
    from tests.fixtures.vllm_dev_stub import VLLMDevStub

    _FakeTRLClient.made.clear()
    servers = [VLLMDevStub(), VLLMDevStub()]  # the HTTP side: /reset_prefix_cache and the weight version
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    publisher = TRLNCCLPublisher(device="cpu", dtype=torch.bfloat16, client_factory=_FakeTRLClient)
    try:
        publisher.prepare(model, 1)
        for server in servers:
            publisher.push(server.url, 1)
        publisher.prepare(model, 2)
        publisher.push(servers[0].url, 2)
        publisher.close()
    finally:
        for server in servers:
            server.stop()
    a, b = _FakeTRLClient.made
    assert (a.group_port, b.group_port) == (51216, 51217)  # one NCCL rendezvous per replica
    assert [c[0] for c in a.calls] == ["init_communicator", "update_named_params", "update_named_params",
                                       "close_communicator"]
    assert [p for _, p, _ in servers[0].calls] == ["/reset_prefix_cache", "/update_weight_version"] * 2
    _, metadata, sent = a.calls[1]
    assert metadata == [("0.weight", "bfloat16", [2, 3]), ("0.bias", "bfloat16", [2]),
                        ("1.weight", "bfloat16", [1, 2]), ("1.bias", "bfloat16", [1])]
    assert [(n, s) for n, s, _ in sent] == [(n, tuple(s)) for n, _, s in metadata]
    assert all(dtype == torch.bfloat16 for _, _, dtype in sent)
    assert not publisher.restore(servers[0].url, 2)  # a restarted vLLM lost its NCCL group: fail loudly


def test_nccl_publisher_turns_trl_client_failures_into_rollout_errors():
    class Failing(_FakeTRLClient):
        def update_named_params(self, metadata, named_params):
            raise Exception("Request failed: 500, weight transfer engine not initialized")  # TRL's bare Exception

    publisher = TRLNCCLPublisher(device="cpu", client_factory=Failing)
    publisher.prepare(torch.nn.Linear(2, 2), 1)
    with pytest.raises(RolloutError, match="http://a:8000 to version 1 failed: Request failed: 500"):
        publisher.push("http://a:8000", 1)


def test_percentiles_are_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.99) == 4.0
