"""The teacher-server client against the embedded server (vLLM's `prompt_logprobs` contract): same scores as the
local teacher; the server's prompt log-probs are the raw model distribution in vLLM's shape, and it refuses what
vLLM refuses; bad answers are typed errors."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_thundersync.distill import teacher_server
from trl_thundersync.distill.teacher import LocalTeacher, check_teacher_scores
from trl_thundersync.distill.teacher_server import ServerTeacher
from trl_thundersync.errors import TeacherScoringError
from trl_thundersync.rollout.vllm_api import HTTPReply, http_call
from trl_thundersync.serve import EmbeddedServer, ServerThread
from trl_thundersync.tiny.model import save_tiny_model

MAX_LOGPROBS = 5  # the server's --max-logprobs here


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("teacher") / "tiny-teacher", hidden_size=32, num_layers=2,
                               seed=4))


@pytest.fixture(scope="module")
def teacher_model(teacher_path):
    return AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def server(teacher_path):
    app = EmbeddedServer(teacher_path, served_name="tiny-teacher", max_in_flight=4, max_logprobs=MAX_LOGPROBS)
    with ServerThread(app) as running:
        yield running


def test_server_scores_equal_local_teacher(server, teacher_model, monkeypatch):
    bodies = []
    complete = server.app.complete
    monkeypatch.setattr(server.app, "complete", lambda body: (bodies.append(body), complete(body))[1])
    client = ServerTeacher(server.url)
    assert client.model == "tiny-teacher"
    context, action = [5, 17, 30, 2, 9], [44, 3, 100]
    remote = client.score(context, action)
    local = LocalTeacher(teacher_model).score(context, action)
    assert torch.allclose(remote.logprobs, local.logprobs, atol=1e-5)
    assert remote.logits is None and not client.full_vocabulary
    assert bodies[-1]["prompt"] == context + action and bodies[-1]["prompt_logprobs"] == 0


def test_one_request_scores_every_turn_of_a_trajectory(server, teacher_model, monkeypatch):
    bodies = []
    complete = server.app.complete
    monkeypatch.setattr(server.app, "complete", lambda body: (bodies.append(body), complete(body))[1])
    client, local = ServerTeacher(server.url), LocalTeacher(teacher_model)
    ids = [5, 17, 30, 2, 9, 44, 3, 100, 61, 8, 12]  # prompt 0-3, action 4-6, observation 7, action 8-10
    spans = client.score_spans(ids, [(4, 7), (8, 11)])
    assert len(bodies) == 1 and bodies[0]["prompt"] == ids
    for (start, end), scores in zip([(4, 7), (8, 11)], spans, strict=True):
        assert torch.allclose(scores.logprobs, local.score(ids[:start], ids[start:end]).logprobs, atol=1e-5)


def test_prompt_logprobs_are_the_raw_distribution_in_vllm_shape(server, teacher_model, teacher_path):
    from transformers import AutoTokenizer

    prompt = [5, 17, 30, 2, 9, 44]
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0.7, "top_k": 3, "seed": 11, "n": 2,
            "prompt_logprobs": 3, "logprobs": 0, "return_token_ids": True}
    reply = http_call(server.url, "POST", "/v1/completions", body, timeout=60)
    assert reply.status == 200
    choices = reply.json()["choices"]
    with torch.no_grad():  # vLLM: log_softmax of the raw logits (no temperature, no top-k), FP32
        reference = torch.log_softmax(teacher_model(input_ids=torch.tensor([prompt])).logits[0, :-1].float(), -1)
    spell = AutoTokenizer.from_pretrained(teacher_path).convert_ids_to_tokens
    entries = choices[0]["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None and choices[1]["prompt_logprobs"] == entries
    for position, entry in enumerate(entries[1:], start=1):
        row, token = reference[position - 1], prompt[position]
        top = torch.topk(row, 3).indices.tolist()
        assert list(entry) == list(dict.fromkeys([str(token)] + [str(t) for t in top]))  # prompt token first
        for key, value in entry.items():
            assert value["logprob"] == pytest.approx(float(row[int(key)]), abs=1e-5)
            assert value["decoded_token"] == spell(int(key))
        assert [entry[str(t)]["rank"] for t in top] == [1, 2, 3]
        assert entry[str(token)]["rank"] == int((row >= row[token]).sum())
    # asking for prompt log-probs leaves the samples as they are (same seed, same tokens and log-probs)
    plain = http_call(server.url, "POST", "/v1/completions", {**body, "prompt_logprobs": None}, timeout=60).json()
    assert [c["token_ids"] for c in plain["choices"]] == [c["token_ids"] for c in choices]
    assert [c["logprobs"] for c in plain["choices"]] == [c["logprobs"] for c in choices]
    assert all(c["prompt_logprobs"] is None for c in plain["choices"])


@pytest.mark.parametrize("value, message", [
    (-2, "`prompt_logprobs` must be a positive value or -1."),
    (MAX_LOGPROBS + 1, f"Requested prompt logprobs of {MAX_LOGPROBS + 1}, which is greater than max allowed: "
                       f"{MAX_LOGPROBS}"),
    (-1, "which is greater than max allowed"),  # -1 asks for the whole vocabulary
])
def test_prompt_logprobs_vllm_refuses_are_refused_with_its_status(server, value, message):
    reply = http_call(server.url, "POST", "/v1/completions", {"prompt": [1, 2, 3], "prompt_logprobs": value},
                      timeout=60)
    error = reply.json()["error"]
    assert reply.status == 400 and error["code"] == 400 and error["type"] == "BadRequestError"
    assert message in error["message"] and error["param"] == "prompt_logprobs"


def tamper(monkeypatch, edit) -> None:
    """The client reads the server's real answer with `edit` applied to its prompt_logprobs list."""
    def call(*args, **kwargs):
        reply = http_call(*args, **kwargs)
        body = reply.json()
        if isinstance(body, dict) and "choices" in body:
            edit(body["choices"][0]["prompt_logprobs"])
        return HTTPReply(reply.status, reply.headers, json.dumps(body).encode())

    monkeypatch.setattr(teacher_server, "http_call", call)


def test_too_few_logprobs_and_nan_are_refused(server, monkeypatch):
    tamper(monkeypatch, lambda entries: entries.pop())
    with pytest.raises(TeacherScoringError, match="returned 7 prompt log-probabilities for 8 prompt tokens"):
        ServerTeacher(server.url).score([1, 2, 3, 4, 5], [6, 7, 8])
    tamper(monkeypatch, lambda entries: [v.update(logprob=float("nan")) for e in entries[1:] for v in e.values()])
    scores = ServerTeacher(server.url).score([1, 2, 3], [4, 5])
    with pytest.raises(TeacherScoringError, match="NaN"):
        check_teacher_scores(scores, 2, None, "turn 0")


def test_http_errors_carry_the_server_message(server):
    with pytest.raises(TeacherScoringError, match="HTTP 404: NotFoundError: The model `nope` does not exist"):
        ServerTeacher(server.url, model="nope").score([1, 2], [3])


def test_unreachable_server_is_a_typed_error():
    with pytest.raises(TeacherScoringError, match="URLError|Connection"):
        ServerTeacher("http://127.0.0.1:9", model="x", timeout=2, retries=0).score([1, 2], [3])


def test_transient_failures_are_sent_again_on_trls_schedule_and_bounded(server, monkeypatch):
    from trl_thundersync.rollout import vllm_api

    monkeypatch.setattr(vllm_api, "RESEND_BACKOFF_S", 0.01)
    script, sent, pauses = [], [], []
    monkeypatch.setattr(teacher_server.time, "sleep", pauses.append)

    def call(*args, **kwargs):
        sent.append(args[2])
        if script:
            status = script.pop(0)
            if status is None:
                raise ConnectionResetError("reset by peer")
            return HTTPReply(status, {}, json.dumps({"error": {"message": "boom", "type": "x"}}).encode())
        return http_call(*args, **kwargs)

    monkeypatch.setattr(teacher_server, "http_call", call)
    client = ServerTeacher(server.url, model="tiny-teacher", retries=3)
    script[:] = [500, None, 503]  # three transient failures, then the real answer
    assert client.score([1, 2, 3], [4, 5]).logprobs.shape == (2,)
    assert len(sent) == 4 and pauses == [0.0, 0.02, 0.04]
    script[:] = [502] * 5
    with pytest.raises(TeacherScoringError, match=r"HTTP 502: .*boom \(sent 4 times\)"):
        client.score([1, 2, 3], [4, 5])
    sent.clear()
    script[:] = [400]  # the server refused the request itself: not resent
    with pytest.raises(TeacherScoringError, match="HTTP 400"):
        client.score([1, 2, 3], [4, 5])
    assert len(sent) == 1


def test_a_dead_vllm_engine_is_not_resent_and_says_so(server, monkeypatch):
    """vLLM answers 500 `EngineCore encountered an issue` once its engine died, then exits: no resend can help."""
    from trl_thundersync.rollout.vllm_api import ENGINE_DEAD_MESSAGE

    sent = []

    def call(*args, **kwargs):
        sent.append(args[2])
        body = {"error": {"message": ENGINE_DEAD_MESSAGE, "type": "InternalServerError", "code": 500}}
        return HTTPReply(500, {}, json.dumps(body).encode())

    monkeypatch.setattr(teacher_server, "http_call", call)
    client = ServerTeacher(server.url, model="tiny-teacher", retries=3)
    with pytest.raises(TeacherScoringError, match="vLLM's engine died .*EngineCore encountered an issue"):
        client.score([1, 2, 3], [4, 5])
    assert len(sent) == 1
