"""`ThunderSyncGKDTrainer`'s argument checks before anything is built: combinations the streamed trainer cannot
honour exactly (refused by name, with the fix), a `trl.DistillationConfig` (why it is not converted), and
teacher/student vocabularies that do not line up."""

from __future__ import annotations

import os

from ...distill.teacher import check_same_vocabulary
from ...errors import UnsupportedOptionError
from .config import ThunderSyncGKDConfig


def refuse_combinations(args, teacher_model, eval_dataset, agentic: bool) -> None:
    """Argument combinations the streamed trainer cannot honour exactly, refused before anything is built."""
    from trl import DistillationConfig

    if isinstance(args, DistillationConfig):
        raise UnsupportedOptionError(DISTILLATION_CONFIG_REFUSAL)
    if not isinstance(args, ThunderSyncGKDConfig):
        raise UnsupportedOptionError(
            f"args is a {type(args).__name__}; pass a ThunderSyncGKDConfig or a trl GKDConfig so unsupported options "
            "are checked (trl's GKDTrainer needs a GKDConfig too)")
    if (teacher_model is None) == (args.teacher_server_url is None):
        raise UnsupportedOptionError(
            "give exactly one teacher: teacher_model (a model or a path, as for trl's GKDTrainer) or "
            f"args.teacher_server_url (got teacher_model={type(teacher_model).__name__}, teacher_server_url="
            f"{args.teacher_server_url!r})")
    if agentic and (args.lmbda < 1.0 or args.seq_kd):
        raise UnsupportedOptionError(
            f"lmbda={args.lmbda}, seq_kd={args.seq_kd}: with tools / environment_factory the dataset holds prompts "
            "only, so there are no off-policy sequences to mix in; use lmbda=1.0 and seq_kd=False")
    if args.teacher_vocab_map is not None and eval_dataset is not None:
        raise UnsupportedOptionError(
            "eval_dataset with teacher_vocab_map: evaluation runs TRL's generalized-JSD loss on the teacher's own "
            "vocabulary, which does not line up with the student's; evaluate separately")
    if args.teacher_server_url is not None and eval_dataset is not None:
        raise UnsupportedOptionError(
            "eval_dataset with teacher_server_url: evaluation runs TRL's generalized-JSD loss, which needs a local "
            "teacher_model; evaluate separately or use a local teacher")


DISTILLATION_CONFIG_REFUSAL = (
    "args is a trl DistillationConfig: ThunderSyncGKDTrainer is the drop-in for trl.experimental.gkd.GKDTrainer, and "
    "a DistillationConfig cannot be converted field by field without changing the update: DistillationTrainer "
    "applies `temperature` to both distributions inside the divergence (GKD: sampling only, divergence at 1), "
    "divides by the scored completion tokens (GKD: num_items_in_batch), reads `prompt` rows (GKD: `messages`), "
    "samples with top_p/top_k/min_p/repetition_penalty from `max_completion_length`, and defaults beta to 1.0 (GKD: "
    "0.5). The closest streamed run (the same loss and normalizer at temperature 1; not compared with "
    "DistillationTrainer step by step): ThunderSyncGKDConfig(lmbda=1.0, temperature=1.0, beta=<your beta>, "
    "max_new_tokens=<max_completion_length>, on_policy_normalizer='scored_tokens') with `messages` rows, or with "
    "`prompt` rows and tools / environment_factory (README: 'trl.DistillationTrainer users')")


def check_vocabularies(model, teacher_model, processing_class) -> None:
    """Refuse teacher/student pairs whose token ids mean different things (before any model is built)."""
    from transformers import AutoConfig, AutoTokenizer

    def vocab_of(m):
        config = AutoConfig.from_pretrained(m) if isinstance(m, str) else getattr(m, "config", None)
        return config.get_text_config().vocab_size if config is not None else None

    teacher_tokenizer = None
    if isinstance(teacher_model, str) and os.path.isfile(os.path.join(teacher_model, "tokenizer_config.json")):
        teacher_tokenizer = AutoTokenizer.from_pretrained(teacher_model)
    student_vocab = vocab_of(model)
    if student_vocab is not None:
        check_same_vocabulary(processing_class, teacher_tokenizer, student_vocab, vocab_of(teacher_model))
