"""The reward side of `ThunderSyncGRPOTrainer`: TRL's completion decoding, its reward functions behind
`RewardScorer` (what reward functions log during a generation batch is flushed by `metrics.py`)."""

from __future__ import annotations

from typing import Any

import transformers
from packaging.version import Version
from trl.chat_template_utils import parse_response
from trl.data_utils import apply_chat_template, is_conversational

from ...streaming.rewards import RewardScorer


def decode_completion(tokenizer: Any, processing_class: Any, tools, prompt, prompt_ids, completion_ids):
    """TRL's completion decoding for one trajectory (parse_response for chat prompts with a response schema);
    `tokenizer` is TRL's `_tokenizer`, `processing_class` and `tools` TRL's own."""
    if is_conversational({"prompt": prompt}):
        tok = tokenizer
        if Version(transformers.__version__) >= Version("5.0.0") and (
            getattr(tok, "response_template", None) is not None or getattr(tok, "response_schema", None) is not None
        ):
            return [parse_response(tok, list(completion_ids), prefix=list(prompt_ids), tools=tools)]
        text = processing_class.decode(list(completion_ids), skip_special_tokens=True)
        return [{"role": "assistant", "content": text}]
    return processing_class.decode(list(completion_ids), skip_special_tokens=True)


def reward_scorer(reward_funcs, names, weights, processing_classes, chat_template_kwargs: dict,
                  async_loop=None) -> RewardScorer:
    """TRL's reward functions, names, weights and processing classes (its `reward_funcs`, `reward_func_names`,
    `reward_weights`, `reward_processing_classes`) behind `streaming.rewards.RewardScorer`."""

    def render(prompt, completion, processing_class):
        if is_conversational({"prompt": prompt}):
            messages = {"messages": prompt + completion}
            return apply_chat_template(messages, processing_class, **chat_template_kwargs)["text"]
        return prompt + completion

    return RewardScorer(reward_funcs, names, weights, processing_classes=processing_classes, async_loop=async_loop,
                        render_text=render)

