"""The package against the frozen vLLM contract (`tests/data/vllm_contract.json`, made by `scripts/vllm_contract.py`
from the released 0.22 … 0.31 wheels) and against the installed TRL's `VLLMClient`.

Every body we send must be a subset of the request class's fields in every supported release (vLLM ignores unknown
fields silently, so a renamed field would not fail there either), every route we call must exist, and the parsers
must read only fields the response classes have (checked by recording which keys they touch).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch

from trl_thundersync.distill.teacher_server import ServerTeacher
from trl_thundersync.rollout import request_fields as rf
from trl_thundersync.rollout.vllm_api import (
    HTTPReply,
    completion_payload,
    error_message,
    parse_completion,
    parse_max_model_len,
    parse_model_ids,
    prompt_logprobs_payload,
)
from trl_thundersync.rollout.vllm_publish import TRLNCCLPublisher
from trl_thundersync.serve import protocol
from trl_thundersync.types import SamplingParams

CONTRACT = json.loads((Path(__file__).parents[2] / "data" / "vllm_contract.json").read_text())
VERSIONS = CONTRACT["versions"]
SUPPORTED = ["0.22.0", "0.26.0", "0.27.0", "0.28.0", "0.31.0"]
SAMPLING = SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05,
                          repetition_penalty=1.1, eos_token_ids=(2,))


def fields(version: str, cls: str) -> set[str]:
    return set(VERSIONS[version]["classes"][cls]["fields"])


def test_the_contract_covers_the_supported_releases_and_every_class():
    assert list(VERSIONS) == SUPPORTED
    for version in SUPPORTED:
        assert all(VERSIONS[version]["classes"][c] is not None for c in CONTRACT["classes"]), version
        # why the client checks generation_kwargs itself: vLLM accepts and ignores unknown request fields
        assert VERSIONS[version]["classes"]["CompletionRequest"]["extra"] == "allow"


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_body_we_send_is_a_subset_of_the_request_fields(version):
    completion = fields(version, "CompletionRequest")
    body = completion_payload("m", [1, 2], SAMPLING, max_tokens=4, seed=3,
                              extra=rf.request_fields({"presence_penalty": 0.5, "stop": ["\n"]}, r"\d+"))
    assert set(body) <= completion, set(body) - completion
    assert set(prompt_logprobs_payload("m", [1, 2])) <= completion
    probe = {"model": "m", "prompt": "text", "add_special_tokens": False}  # vllm_replicas.check_server_tokenizer
    assert set(probe) <= fields(version, "TokenizeCompletionRequest")
    lora = fields(version, "LoadLoRAAdapterRequest")  # vllm_publish.LoRAAdapterPublisher's bodies
    assert {"lora_name", "lora_path", "load_inplace"} <= lora
    assert {"lora_name"} <= fields(version, "UnloadLoRAAdapterRequest")


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_route_we_call_exists(version):
    routes = set(VERSIONS[version]["routes"])
    used = {"GET /health", "GET /v1/models", "GET /version", "GET /server_info", "POST /v1/completions",
            "POST /tokenize", "POST /v1/load_lora_adapter", "POST /v1/unload_lora_adapter", "POST /reset_prefix_cache",
            # TRL 1.16's NCCL weight transfer (VLLMClient.init_communicator / update_named_params)
            "POST /init_weight_transfer_engine", "POST /start_weight_update", "POST /update_weights",
            "POST /finish_weight_update"}
    assert used <= routes, used - routes
    assert VERSIONS[version]["routes"]["POST /v1/completions"]["request"] == "CompletionRequest"
    confirmed = {"POST /update_weight_version", "GET /weight_info"}  # the server-confirmed version (vLLM >= 0.27)
    assert (confirmed <= routes) == (version >= "0.27")
    if version >= "0.27":  # POST /update_weight_version takes one embedded body field
        assert VERSIONS[version]["routes"]["POST /update_weight_version"]["body"] == ["new_version"]
    assert VERSIONS[version]["routes"]["GET /server_info"]["query"] == ["config_format"]  # server_info.read_limits


def test_the_runtime_field_table_is_the_contract_union_with_first_releases():
    first: dict[str, str] = {}
    for version in SUPPORTED:
        for name in fields(version, "CompletionRequest"):
            first.setdefault(name, version.rsplit(".", 1)[0])
    assert rf.VLLM_COMPLETION_FIELDS == first
    assert set(rf.OWNED) <= set(first) and rf.NEUTRAL <= set(first)


def test_the_embedded_server_classifies_every_vllm_request_field():
    union = set().union(*(fields(v, "CompletionRequest") for v in SUPPORTED))
    groups = [protocol.IMPLEMENTED, protocol.IGNORED, set(protocol.REFUSED)]
    assert set().union(*groups) == union, set().union(*groups) ^ union
    assert sum(len(g) for g in groups) == len(union)  # disjoint
    for name, off in protocol.REFUSED.items():  # "off" is vLLM's default (or None) in every release that has it
        defaults = {json.dumps(VERSIONS[v]["classes"]["CompletionRequest"]["fields"][name]) for v in SUPPORTED
                    if name in fields(v, "CompletionRequest")}
        assert defaults <= {json.dumps(off), "null", '"<expr>"', "[]"}, (name, defaults)


class Recording(dict):
    """A dict that records every key read from it (and from the dicts and lists inside it)."""

    def __init__(self, data, path: str, seen: set[str]) -> None:
        super().__init__({k: _wrap(v, f"{path}.<token id>" if str(k).isdigit() else f"{path}.{k}", seen)
                          for k, v in data.items()})
        self._path, self._seen = path, seen

    def __getitem__(self, key):
        self._seen.add(self._name(key))
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._seen.add(self._name(key))
        return super().get(key, default)

    def _name(self, key) -> str:
        return f"{self._path}.<token id>" if str(key).isdigit() else f"{self._path}.{key}"


def _wrap(value, path, seen):
    if isinstance(value, dict):
        return Recording(value, path, seen)
    if isinstance(value, list):
        return [_wrap(v, f"{path}[]", seen) for v in value]
    return value


def _allowed(version: str) -> set[str]:
    """Readable key paths of the answers we parse, from the response classes."""
    out = {f"completion.{f}" for f in fields(version, "CompletionResponse")}
    out |= {f"completion.choices[].{f}" for f in fields(version, "CompletionResponseChoice")}
    out |= {f"completion.choices[].logprobs.{f}" for f in fields(version, "CompletionLogProbs")}
    out |= {"completion.choices[].prompt_logprobs[].<token id>"}  # {token id: Logprob} per prompt position
    out |= {f"completion.choices[].prompt_logprobs[].<token id>.{f}" for f in fields(version, "Logprob")}
    out |= {f"models.{f}" for f in fields(version, "ModelList")}
    out |= {f"models.data[].{f}" for f in fields(version, "ModelCard")}
    out |= {f"error.{f}" for f in fields(version, "ErrorResponse")}
    out |= {f"error.error.{f}" for f in fields(version, "ErrorInfo")}
    return out


COMPLETION = {"id": "c", "object": "text_completion", "created": 1, "model": "m", "choices": [{
    "index": 0, "text": "", "logprobs": {"text_offset": [0, 1], "token_logprobs": [-0.5, -0.25],
                                         "tokens": ["token_id:5", "token_id:2"], "top_logprobs": [{}, {}]},
    "finish_reason": "stop", "stop_reason": 2, "token_ids": [5, 2], "prompt_logprobs": None,
    "prompt_token_ids": [1, 2]}], "usage": {"prompt_tokens": 2, "total_tokens": 4, "completion_tokens": 2}}


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_parsers_read_only_listed_response_fields(version):
    seen: set[str] = set()
    parse_completion(Recording(COMPLETION, "completion", seen))
    models = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 64}]}
    parse_model_ids(Recording(models, "models", seen))
    parse_max_model_len(Recording(models, "models", seen))
    body = {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}

    class Reply(HTTPReply):
        def json(self):
            return Recording(body, "error", seen)

    assert error_message(Reply(400, {}, b"{}")) == "BadRequestError: bad"
    assert seen and seen <= _allowed(version), seen - _allowed(version)


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_teacher_and_the_server_info_reader_read_listed_fields(version):
    seen: set[str] = set()
    answer = {"choices": [{"prompt_logprobs": [None, {"7": {"logprob": -1.0, "rank": 1, "decoded_token": "x"}}]}]}
    teacher = ServerTeacher.__new__(ServerTeacher)
    teacher.url = "http://teacher"
    entries = teacher._prompt_logprobs(Recording(answer, "completion", seen), 2)
    assert teacher._span_logprobs(entries, [3, 7], 1, 2) == [-1.0]
    assert seen <= _allowed(version)
    configs = VERSIONS[version]["configs"]  # /server_info: vllm_config.<section>.<field> (server_info.read_limits)
    assert {"model_config", "scheduler_config", "weight_transfer_config"} <= set(configs["VllmConfig"])
    assert "logprobs_mode" in configs["ModelConfig"] and "max_num_seqs" in configs["SchedulerConfig"]
    assert "tokens" in fields(version, "TokenizeResponse")  # check_server_tokenizer reads it


class RecordingClient:
    """Stands in for TRL's `VLLMClient`: records how `TRLNCCLPublisher` constructs and calls it."""

    calls: list[tuple[str, tuple, dict]] = []

    def __init__(self, *args, **kwargs) -> None:
        RecordingClient.calls.append(("__init__", args, kwargs))

    def __getattr__(self, name):
        def record(*args, **kwargs):
            if name == "update_named_params":
                args = (args[0], list(args[1]))  # drain the stream like the real client does
            RecordingClient.calls.append((name, args, kwargs))
        return record


def test_the_publisher_calls_the_installed_trl_client_with_its_signatures():
    from trl.generation.vllm_client import VLLMClient

    from tests.fixtures.vllm_dev_stub import VLLMDevStub

    RecordingClient.calls = []
    server = VLLMDevStub()  # the HTTP side (/reset_prefix_cache, /update_weight_version) is the publisher's own
    try:
        publisher = TRLNCCLPublisher(device="cpu", group_port=51216, connection_timeout=5.0,
                                     client_factory=RecordingClient)
        publisher.prepare(torch.nn.Linear(2, 2), version=1)
        publisher.push(server.url, 1)
        publisher.close()
    finally:
        server.stop()
    names = [c[0] for c in RecordingClient.calls]
    assert names == ["__init__", "init_communicator", "update_named_params", "close_communicator"]
    for name, args, kwargs in RecordingClient.calls:
        method = VLLMClient.__init__ if name == "__init__" else getattr(VLLMClient, name)
        inspect.signature(method).bind(None, *args, **kwargs)  # TypeError if the call no longer fits
    metadata = RecordingClient.calls[2][1][0]
    assert all(isinstance(n, str) and isinstance(d, str) and not d.startswith("torch.") and isinstance(s, list)
               for n, d, s in metadata)  # TRL's documented (name, vLLM dtype name, shape) triplets
