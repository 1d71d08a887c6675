"""A teacher with another vocabulary that computes exactly what a given teacher computes: its token rows moved to
other ids (a permutation) and, optionally, extra random tokens. Used to test `teacher_vocab_map`.

    teacher_b, student_to_teacher = relabelled_teacher(teacher_a, extra_tokens=37, seed=0)
    # teacher_b reading student_to_teacher[ids] gives teacher_a's logits on ids, at columns student_to_teacher
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def relabelled_teacher(model: Any, *, extra_tokens: int = 0, seed: int = 0) -> tuple[Any, list[int]]:
    """(a copy of `model` whose vocabulary has V + extra_tokens entries, the V-entry student → teacher id map).

    Every decoder weight is shared in value; the embedding row (tied with the output head, as in the tiny models)
    of student id s moves to teacher id map[s]; the extra rows are random."""
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(seed)
    student_to_teacher = torch.randperm(vocab + extra_tokens, generator=generator)[:vocab]
    teacher = copy.deepcopy(model)
    old = model.get_input_embeddings().weight.detach()
    rows = torch.randn(vocab + extra_tokens, old.shape[1], generator=generator, dtype=old.dtype) * old.std()
    rows[student_to_teacher] = old
    teacher.resize_token_embeddings(vocab + extra_tokens)
    with torch.no_grad():
        teacher.get_input_embeddings().weight.copy_(rows)
        head = teacher.get_output_embeddings().weight
        if head.data_ptr() != teacher.get_input_embeddings().weight.data_ptr():
            head.copy_(rows)
    return teacher, student_to_teacher.tolist()
