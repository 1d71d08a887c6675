"""`teacher_vocab_map`: validation, and a teacher with a permuted / larger vocabulary scoring exactly like the
teacher with the student's vocabulary once the map is applied."""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.vocab import relabelled_teacher
from trl_thundersync.distill.teacher import LocalTeacher
from trl_thundersync.distill.vocab_map import VocabularyMap
from trl_thundersync.errors import VocabularyMismatchError
from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def teacher():
    return build_tiny_model(build_tiny_tokenizer(), hidden_size=32, num_layers=2, seed=5).eval()


@pytest.mark.parametrize("extra", [0, 37])  # a permutation; a superset with 37 more tokens
def test_mapped_teacher_scores_like_the_same_vocabulary_teacher(teacher, extra):
    other, mapping = relabelled_teacher(teacher, extra_tokens=extra, seed=1)
    vocab = teacher.config.vocab_size
    assert other.config.vocab_size == vocab + extra and mapping != list(range(vocab))
    mapped = LocalTeacher(other, "cpu", VocabularyMap.from_list(mapping, student_vocab=vocab,
                                                                teacher_vocab=vocab + extra))
    context, action = [3, 17, 250, 9, 4], [88, 120, 7, 301]
    reference, scores = LocalTeacher(teacher, "cpu").score(context, action), mapped.score(context, action)
    assert scores.logits.shape == reference.logits.shape == (len(action), vocab)
    torch.testing.assert_close(scores.logits, reference.logits, rtol=1e-6, atol=1e-6)
    if extra == 0:  # the whole distribution moved: the sampled tokens' log-probs are the same
        torch.testing.assert_close(scores.logprobs, reference.logprobs, rtol=1e-6, atol=1e-6)
    else:  # the extra tokens take some mass of the teacher's softmax: log π_T is lower, never higher
        assert bool((scores.logprobs < reference.logprobs).all())
    unmapped = LocalTeacher(other, "cpu").score(context, action)
    assert not torch.allclose(unmapped.logprobs, reference.logprobs)  # the map is what makes them agree


def test_map_must_be_total_and_in_range(tmp_path):
    with pytest.raises(VocabularyMismatchError, match="has 3 entries but the student's vocab_size is 4"):
        VocabularyMap.from_list([0, 1, 2], student_vocab=4, teacher_vocab=10)
    with pytest.raises(VocabularyMismatchError, match="student id 2 maps to 10, outside .*\\[0, 10\\)"):
        VocabularyMap.from_list([0, 1, 10, 3], student_vocab=4, teacher_vocab=10)
    with pytest.raises(VocabularyMismatchError, match="student id 1 maps to -1"):
        VocabularyMap.from_list([0, -1, 2, 3], student_vocab=4, teacher_vocab=None)
    with pytest.raises(VocabularyMismatchError, match="integer teacher ids"):
        VocabularyMap.from_list([0, 1.5, 2, 3], student_vocab=4, teacher_vocab=10)
    path = tmp_path / "map.json"
    path.write_text("{not json")
    with pytest.raises(VocabularyMismatchError, match="cannot read a JSON list"):
        VocabularyMap.from_json(path, student_vocab=4, teacher_vocab=10)
    path.write_text(json.dumps([9, 0, 4, 1]))
    vocab = VocabularyMap.from_json(path, student_vocab=4, teacher_vocab=10)
    assert vocab.to_teacher([3, 0, 0]) == [1, 9, 9] and vocab.to_teacher([]) == []
    logits = torch.arange(20.0).reshape(2, 10)
    assert vocab.student_logits(logits).tolist() == [[9.0, 0.0, 4.0, 1.0], [19.0, 10.0, 14.0, 11.0]]


def test_teacher_server_with_another_vocabulary_scores_through_the_map(teacher):
    from tests.fixtures.fake_teacher_server import FakeTeacherServer
    from trl_thundersync.distill.teacher_server import ServerTeacher

    other, mapping = relabelled_teacher(teacher, seed=2)
    vocab = teacher.config.vocab_size
    server = FakeTeacherServer(other)
    try:
        client = ServerTeacher(server.url, vocab_map=VocabularyMap.from_list(mapping, student_vocab=vocab,
                                                                             teacher_vocab=None))
        context, action = [3, 17, 250, 9, 4], [88, 120, 7, 301]
        scores = client.score(context, action)
        sent = server.requests[-1]["prompt"]
    finally:
        server.close()
    assert sent == [mapping[t] for t in context + action]  # the server read teacher ids
    reference = LocalTeacher(teacher, "cpu").score(context, action)
    torch.testing.assert_close(scores.logprobs, reference.logprobs, rtol=1e-5, atol=1e-5)
