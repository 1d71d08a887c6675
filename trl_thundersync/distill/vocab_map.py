"""A student → teacher token-id map, for a teacher whose vocabulary orders (or extends) the student's differently.

The map is a JSON file holding one list of V_s integers: entry s is the teacher id of student token s. It must be
total over the student vocabulary (every id the student can sample has a teacher id) and in range of the teacher's.

    vocab = VocabularyMap.from_json(path, student_vocab=V_s, teacher_vocab=V_t)
    teacher_ids = vocab.to_teacher(student_ids)      # what the teacher reads and scores (OPD: log π_T of these)
    logits_s = vocab.student_logits(logits_t)        # (T, V_t) → (T, V_s): the teacher's logits at the mapped ids

`student_logits` gathers, it does not renormalize: a softmax over the gathered row is the teacher's distribution
restricted to the student's vocabulary, which is what the generalized JSD compares against (for a permuted
vocabulary it is the teacher's whole distribution; for a superset, the extra tokens' mass is left out).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import VocabularyMismatchError


@dataclass(frozen=True)
class VocabularyMap:
    student_to_teacher: torch.Tensor  # (V_s,) int64: teacher token id of each student token id

    @classmethod
    def from_json(cls, path: str | Path, *, student_vocab: int, teacher_vocab: int | None) -> VocabularyMap:
        try:
            entries = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise VocabularyMismatchError(f"teacher_vocab_map={str(path)!r}: cannot read a JSON list of teacher ids "
                                          f"({type(exc).__name__}: {exc})") from exc
        return cls.from_list(entries, student_vocab=student_vocab, teacher_vocab=teacher_vocab, source=str(path))

    @classmethod
    def from_list(cls, entries: Sequence[int], *, student_vocab: int, teacher_vocab: int | None,
                  source: str = "the map") -> VocabularyMap:
        """Validate: a list of exactly `student_vocab` integers, each in [0, teacher_vocab)."""
        where = f"teacher_vocab_map ({source})"
        if not isinstance(entries, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in entries):
            raise VocabularyMismatchError(f"{where}: expected a JSON list of integer teacher ids, one per student id")
        if len(entries) != student_vocab:
            raise VocabularyMismatchError(
                f"{where}: has {len(entries)} entries but the student's vocab_size is {student_vocab}; the map must "
                "give a teacher id for every student id")
        ids = torch.tensor(entries, dtype=torch.long)
        upper = teacher_vocab
        bad = (ids < 0) if upper is None else (ids < 0) | (ids >= upper)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise VocabularyMismatchError(
                f"{where}: student id {first} maps to {entries[first]}, outside the teacher's vocabulary [0, "
                f"{upper if upper is not None else '∞'}); {int(bad.sum())} entries are out of range")
        return cls(ids)

    @property
    def student_vocab(self) -> int:
        return self.student_to_teacher.numel()

    def to_teacher(self, ids: Sequence[int]) -> list[int]:
        """Student token ids → teacher token ids."""
        return self.student_to_teacher[torch.as_tensor(list(ids), dtype=torch.long)].tolist() if ids else []

    def student_logits(self, teacher_logits: torch.Tensor) -> torch.Tensor:
        """(T, V_t) teacher logits → (T, V_s): column s is the teacher's logit of the teacher id of student id s."""
        return teacher_logits.index_select(-1, self.student_to_teacher.to(teacher_logits.device))
