"""Tiny offline Qwen3-style model and tokenizer, for tests, examples and CPU smoke runs.

Nothing is downloaded: a byte-level BPE tokenizer is trained with `tokenizers` on a built-in corpus, wrapped in
`PreTrainedTokenizerFast` with TRL's bundled Qwen3 chat template (so tool calls render and parse), and a Qwen3
config with random weights is saved beside it. The result is a normal Hugging Face model folder, loadable with
`AutoModelForCausalLM.from_pretrained(path)` and by name in TRL scripts.

    python -m trl_thundersync.tiny.model ./tiny-qwen3      # or: trl-thundersync-tiny ./tiny-qwen3
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
from pathlib import Path

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# A few KB of text in the shapes the model will see: chat turns, arithmetic, JSON tool calls, shell output.
_CORPUS_LINES = (
    "user: What is 2 + 3? assistant: 2 + 3 = 5. The answer is 5.",
    "Count the letters in the word banana. There are 6 letters.",
    '{"name": "run_shell", "arguments": {"command": "ls -la"}}',
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    "def add(a, b):\n    return a + b\n",
    "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nAssertionError",
    "$ pytest -q\n3 passed, 1 failed in 0.12s",
    "You are a helpful assistant. Answer briefly and call tools when needed.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "Write a short poem about the sea. Waves roll in, waves roll out.",
)


def _corpus() -> list[str]:
    lines = list(_CORPUS_LINES)
    lines += [f"{a} + {b} = {a + b}" for a in range(20) for b in range(0, 20, 3)]
    lines += [f"{a} * {b} = {a * b}" for a in range(12) for b in range(12)]
    return lines * 3


def build_tiny_tokenizer(vocab_size: int = 512):
    """Train a byte-level BPE tokenizer offline; returns a `PreTrainedTokenizerFast` with a tool-calling template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import add_response_schema

    backend = Tokenizer(models.BPE(unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    template = importlib.resources.files("trl").joinpath("chat_templates/qwen3.jinja").read_text()
    tokenizer.chat_template = template
    return add_response_schema(tokenizer)


def build_tiny_model(tokenizer, hidden_size: int = 64, num_layers: int = 2, seed: int = 0):
    """A Qwen3 causal LM with random weights sized for a CPU test (≈100k parameters with the default vocab)."""
    from transformers import Qwen3Config

    return model_from_config(Qwen3Config(**tiny_shape(tokenizer, hidden_size, num_layers)), tokenizer, seed)


HEAD_DIM = 32  # the smallest head size vLLM's CPU attention serves (`rollout/vllm_shapes.py`); 16 or 24 kill it


def attention_shape(hidden_size: int) -> dict:
    """Heads of the tiny models: `hidden_size // HEAD_DIM` query heads (at least one) of HEAD_DIM each, half as many
    KV heads (one when the count is odd). Width 64 → 2 heads, 1 KV head: q/k/v/o projections 64/32/32/64 wide and
    2 query heads per KV head, so the grouped-query path (HF's `repeat_kv`, vLLM's GQA) stays exercised as in
    released Qwen3 checkpoints; 128 → 4 heads, 2 KV; 96 → 3 heads, 1 KV; 32 → 1 head, 1 KV."""
    heads = max(1, hidden_size // HEAD_DIM)
    return dict(num_attention_heads=heads, num_key_value_heads=heads // 2 if heads % 2 == 0 else 1,
                head_dim=HEAD_DIM)


def tiny_shape(tokenizer, hidden_size: int, num_layers: int) -> dict:
    """The config fields every tiny model here shares: vocabulary and special ids of `tokenizer`, the heads of
    `attention_shape` (a head size a CPU vLLM serves), tied embeddings, no dropout."""
    return dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=num_layers, **attention_shape(hidden_size), max_position_embeddings=2048,
                tie_word_embeddings=True, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, attention_dropout=0.0)


def built_shape(hidden_size: int, num_layers: int) -> dict:
    """The config fields that tell a tiny model folder's shape (`folder_has_shape` compares them)."""
    return dict(hidden_size=hidden_size, num_hidden_layers=num_layers, **attention_shape(hidden_size))


def folder_has_shape(path: str | Path, shape: dict) -> bool:
    """Whether the model folder at `path` has a config.json whose fields equal `shape`'s: a folder cached by an
    older builder (e.g. head size 16, which a CPU vLLM cannot serve) does not, and is rebuilt."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return all(config.get(key) == value for key, value in shape.items())


def model_from_config(config, tokenizer, seed: int):
    """Random FP32 weights for `config` (seeded), with `tokenizer`'s EOS/pad ids as the generation defaults."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny_model(path: str | Path, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Path:
    """Create (or reuse, if it has this shape) a tiny model folder at `path` and return it."""
    return save_model_folder(path, lambda tokenizer: build_tiny_model(tokenizer, hidden_size=hidden_size,
                                                                      num_layers=num_layers, seed=seed),
                             shape=built_shape(hidden_size, num_layers))


def save_model_folder(path: str | Path, build, shape: dict | None = None) -> Path:
    """Write the tiny tokenizer and `build(tokenizer)`'s model to `path`, unless a model folder is already there
    (and, given `shape`, has that shape: `folder_has_shape`; otherwise it is overwritten)."""
    path = Path(path)
    if ((path / "config.json").exists() and (path / "tokenizer.json").exists()
            and (shape is None or folder_has_shape(path, shape))):
        return path
    tokenizer = build_tiny_tokenizer()
    model = build(tokenizer)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default="tiny-qwen3", help="output folder")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = save_tiny_model(args.path, args.hidden_size, args.num_layers, args.seed)
    print(f"tiny model and tokenizer written to {out}")


if __name__ == "__main__":
    main()
