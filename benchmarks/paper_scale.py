"""The memory plan at the paper's scale (issue 40): 8 B, 27 B and 32 B models, full fine-tuning and LoRA, today's
layout beside the paper's (4 learner ranks, replicated BF16 parameters, ZeRO-1 FP32 optimizer moments, the FP32
streamed state in pinned host memory). Every figure is a prediction of `python -m trl_thundersync.memory`; the
paper's layout is a design the trainer does not build yet.

    python -m benchmarks.paper_scale [--prompt_length 1024] [--completion_length 1024]

Configs are written from the public widths (no weights, nothing downloaded): Qwen3-8B, Gemma-3-27B's widths in a
Qwen3 config (the paper's 27 B model is Qwen-family), Qwen3-32B. Each run: BF16, AdamW, gradient checkpointing, 32
trajectories per learner process in groups of 8 (TRL's micro-batches of 4), prompts and completions of 1,024 tokens,
`memory_budget="auto"`, LoRA rank 16 on every linear layer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path

from trl_thundersync.memory.__main__ import main as plan_command

# (hidden, layers, intermediate, heads, kv heads, head_dim, vocab, tied embeddings): public model cards
MODELS = {"8B": (4096, 36, 12288, 32, 8, 128, 151936, False),
          "27B": (5376, 62, 21504, 32, 16, 128, 262208, True),
          "32B": (5120, 64, 25600, 64, 8, 128, 151936, False)}
LAYOUTS = {"today": [], "paper": ["--ranks", "4", "--optimizer_state_bytes", "4", "--host_state"]}


def write_config(folder: Path, name: str) -> Path:
    hidden, layers, intermediate, heads, kv, head_dim, vocab, tied = MODELS[name]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=hidden, num_hidden_layers=layers,
        intermediate_size=intermediate, num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
        vocab_size=vocab, tie_word_embeddings=tied, dtype="bfloat16")))
    return folder


def peaks(text: str) -> dict[str, list[str]]:
    """The 'peak' rows of a printed plan: {"device": [trl, sync, thundersync], "host": [...]}."""
    out = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["peak"]:
            where = words[1].strip("()") if words[1].startswith("(") else "device"
            start = 2 if words[1].startswith("(") else 1
            out[where] = [" ".join(words[start + 2 * i: start + 2 * i + 2]) for i in range(3)]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt_length", type=int, default=1024)
    parser.add_argument("--completion_length", type=int, default=1024)
    args = parser.parse_args(argv)
    rows = ["| model | training | layout | stock TRL (device) | sync (device) | thundersync (device) | "
            "thundersync (host) | caps |", "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as work:
        for name in MODELS:
            folder = write_config(Path(work) / name, name)
            for training, extra in (("full", []), ("LoRA r=16", ["--lora_r", "16"])):
                for layout, flags in LAYOUTS.items():
                    printed = io.StringIO()
                    with contextlib.redirect_stdout(printed):
                        plan_command(["--model", str(folder), "--per_device_train_batch_size", "4",
                                      "--gradient_accumulation_steps", "8",
                                      "--num_generations", "8", "--prompt_length", str(args.prompt_length),
                                      "--max_completion_length", str(args.completion_length),
                                      "--gradient_checkpointing", "1", *extra, *flags])
                    text = printed.getvalue()
                    found = peaks(text)
                    caps = next(line.strip() for line in text.splitlines() if "memory_budget" in line)
                    host = found["host"][2] if "host" in found else "–"
                    rows.append(f"| {name} | {training} | {layout} | {' | '.join(found['device'])} | {host} | "
                                f"{caps.split('): ', 1)[-1]} |")
    print("Predictions of the memory plan (nothing here is measured); 'paper' is a layout the trainer does not "
          "build yet")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
