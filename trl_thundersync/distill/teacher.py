"""The frozen teacher: the `TeacherScorer` protocol, a local-model implementation and the checks on its answers.

Lifecycle: the distillation pipeline calls `score(context_ids, action_ids)` once per turn, from its teacher thread,
as soon as the turn's action is complete (`teacher_scoring="turn"`), or, when the scorer also offers
`score_spans(ids, spans)`, one call per trajectory over its longest sequence (`"trajectory"`, `teacher_schedule`);
`close()` once when training ends. A scorer never sees the student.
`full_vocabulary` says whether `TeacherScores.logits` is filled (needed by the generalized JSD; OPD needs only the
sampled-token log-probs, which a teacher server can return).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from ..errors import TeacherScoringError, VocabularyMismatchError
from .losses import action_logprobs
from .records import TeacherScores
from .vocab_map import VocabularyMap


@runtime_checkable
class TeacherScorer(Protocol):
    full_vocabulary: bool  # True: `score` also returns (T, V) logits over the student's vocabulary

    def score(self, context_ids: Sequence[int], action_ids: Sequence[int]) -> TeacherScores: ...

    def close(self) -> None: ...


class LocalTeacher:
    """A teacher model in this process: one no-grad forward over context + action per turn, logits at temperature 1
    (as TRL's GKD loss uses them). With a `VocabularyMap` the teacher reads the mapped ids, scores the mapped action
    ids over its own vocabulary, and its logits are gathered at the mapped ids (one column per student id)."""

    full_vocabulary = True

    def __init__(self, model: Any, device: torch.device | str | None = None,
                 vocab_map: VocabularyMap | None = None) -> None:
        self.model = model
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.vocab_map = vocab_map

    def score(self, context_ids: Sequence[int], action_ids: Sequence[int]) -> TeacherScores:
        if not action_ids:
            return TeacherScores(torch.zeros(0), torch.zeros(0, 0))
        start = len(context_ids)
        return self.score_spans(list(context_ids) + list(action_ids), [(start, start + len(action_ids))])[0]

    @torch.no_grad()
    def score_spans(self, ids: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[TeacherScores]:
        """One forward over `ids`; the scores of each action span [start, end) (`teacher_schedule`)."""
        if self.vocab_map is not None:
            ids = self.vocab_map.to_teacher(ids)
        tokens = torch.tensor([list(ids)], device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model(input_ids=tokens).logits[0].float()
        finally:
            self.model.train(was_training)
        out = []
        for start, end in spans:
            span_logits = logits[start - 1 : end - 1]
            logprobs = action_logprobs(span_logits, tokens[0, start:end])
            if self.vocab_map is not None:
                span_logits = self.vocab_map.student_logits(span_logits)
            out.append(TeacherScores(logprobs, span_logits))
        return out

    def close(self) -> None:
        return None


def check_teacher_scores(scores: TeacherScores, num_actions: int, vocab_size: int | None, where: str) -> None:
    """Refuse malformed teacher answers loudly (never pad, truncate or zero them)."""
    if scores.logprobs.shape != (num_actions,):
        raise TeacherScoringError(
            f"{where}: the teacher returned {tuple(scores.logprobs.shape)} log-probabilities for {num_actions} action "
            "tokens; it must score every sampled token exactly once"
        )
    if not bool(torch.isfinite(scores.logprobs).all()):
        bad = int((~torch.isfinite(scores.logprobs)).sum())
        raise TeacherScoringError(f"{where}: {bad} of {num_actions} teacher log-probabilities are NaN/inf")
    if vocab_size is not None:
        if scores.logits is None:
            raise TeacherScoringError(f"{where}: the objective needs full-vocabulary teacher logits, got none")
        if num_actions and scores.logits.shape != (num_actions, vocab_size):
            raise TeacherScoringError(
                f"{where}: teacher logits have shape {tuple(scores.logits.shape)}, expected ({num_actions}, "
                f"{vocab_size}) (one row per action token over the student's vocabulary)"
            )
        if not bool(torch.isfinite(scores.logits).all()):
            raise TeacherScoringError(f"{where}: the teacher's logits contain NaN/inf")


def check_same_vocabulary(student_tokenizer: Any, teacher_tokenizer: Any | None, student_vocab: int,
                          teacher_vocab: int | None) -> None:
    """Teacher scores of student tokens only mean something if both map the same ids to the same tokens."""
    if teacher_vocab is not None and teacher_vocab != student_vocab:
        raise VocabularyMismatchError(
            f"the student's vocab_size is {student_vocab} but the teacher's is {teacher_vocab}; on-policy "
            "distillation scores the student's token ids with the teacher, so both must share one vocabulary. "
            "Use a teacher from the same model family (same tokenizer), or give teacher_vocab_map (a JSON list: "
            "the teacher id of every student id)"
        )
    if teacher_tokenizer is None or student_tokenizer is None:
        return
    student, teacher = student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if student != teacher:
        differing = sorted(set(student.items()) ^ set(teacher.items()))[:3]
        raise VocabularyMismatchError(
            f"the teacher's tokenizer differs from the student's ({len(student)} vs {len(teacher)} entries; first "
            f"differences: {differing}); the same token id would name different text. Use one tokenizer family, "
            "or give teacher_vocab_map (a JSON list: the teacher id of every student id)"
        )

