"""The teacher-server client against a fake vLLM-compatible server: same scores as the local teacher; bad answers
are typed errors."""

from __future__ import annotations

import pytest
import torch

from trl_thundersync.distill.teacher import LocalTeacher, check_teacher_scores
from trl_thundersync.distill.teacher_server import ServerTeacher
from trl_thundersync.errors import TeacherScoringError
from trl_thundersync.testing.fake_teacher_server import FakeTeacherServer
from trl_thundersync.testing.tiny import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def teacher_model():
    return build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2, seed=4).eval()


def test_server_scores_equal_local_teacher(teacher_model):
    server = FakeTeacherServer(teacher_model)
    try:
        client = ServerTeacher(server.url)
        assert client.model == "tiny-teacher"
        context, action = [5, 17, 30, 2, 9], [44, 3, 100]
        remote = client.score(context, action)
        local = LocalTeacher(teacher_model).score(context, action)
        assert torch.allclose(remote.logprobs, local.logprobs, atol=1e-5)
        assert remote.logits is None and not client.full_vocabulary
        assert server.requests[-1]["prompt"] == context + action and server.requests[-1]["prompt_logprobs"] == 0
    finally:
        server.close()


def test_too_few_logprobs_and_nan_are_refused(teacher_model):
    short, nan = FakeTeacherServer(teacher_model, drop_last=True), FakeTeacherServer(teacher_model, nan=True)
    try:
        with pytest.raises(TeacherScoringError, match="returned 7 prompt log-probabilities for 8 prompt tokens"):
            ServerTeacher(short.url).score([1, 2, 3, 4, 5], [6, 7, 8])
        scores = ServerTeacher(nan.url).score([1, 2, 3], [4, 5])
        with pytest.raises(TeacherScoringError, match="NaN"):
            check_teacher_scores(scores, 2, None, "turn 0")
    finally:
        short.close()
        nan.close()


def test_unreachable_server_is_a_typed_error():
    with pytest.raises(TeacherScoringError, match="URLError|Connection"):
        ServerTeacher("http://127.0.0.1:9", model="x", timeout=2).score([1, 2], [3])
