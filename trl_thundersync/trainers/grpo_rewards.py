"""The reward side of `ThunderSyncGRPOTrainer`: TRL's completion decoding, its reward functions behind
`RewardScorer` (what reward functions log during a generation batch is flushed by `grpo_metrics`)."""

from __future__ import annotations

from typing import Any

import transformers
from packaging.version import Version
from trl.chat_template_utils import parse_response
from trl.data_utils import apply_chat_template, is_conversational

from ..streaming.rewards import RewardScorer


def decode_completion(trainer: Any, prompt, prompt_ids, completion_ids):
    """TRL's completion decoding for one trajectory (parse_response for chat prompts with a response schema)."""
    if is_conversational({"prompt": prompt}):
        tok = trainer._tokenizer
        if Version(transformers.__version__) >= Version("5.0.0") and (
            getattr(tok, "response_template", None) is not None or getattr(tok, "response_schema", None) is not None
        ):
            return [parse_response(tok, list(completion_ids), prefix=list(prompt_ids), tools=trainer.tools)]
        text = trainer.processing_class.decode(list(completion_ids), skip_special_tokens=True)
        return [{"role": "assistant", "content": text}]
    return trainer.processing_class.decode(list(completion_ids), skip_special_tokens=True)


def reward_scorer(trainer: Any) -> RewardScorer:
    """TRL's reward functions, weights and processing classes behind `streaming.rewards.RewardScorer`."""

    def render(prompt, completion, processing_class):
        if is_conversational({"prompt": prompt}):
            messages = {"messages": prompt + completion}
            return apply_chat_template(messages, processing_class, **trainer.chat_template_kwargs)["text"]
        return prompt + completion

    return RewardScorer(trainer.reward_funcs, trainer.reward_func_names, trainer.reward_weights,
                        processing_classes=trainer.reward_processing_classes,
                        async_loop=getattr(trainer, "async_loop", None), render_text=render)

