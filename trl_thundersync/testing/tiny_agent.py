"""A tiny *agent* model: the offline tiny Qwen3 warm-started to call tools, so CPU examples have real multi-turn work.

A random-weight model never emits a tool call, so an agentic example on it would run one turn per trajectory and
learn from identical rewards. Here the tiny model is fine-tuned for a few hundred steps (about a minute on two
cores, once; the result is cached in a folder) on synthetic transcripts in the chat template's tool-call format:
inspect the repository, run the tests, maybe look again, submit. It knows nothing about fixing bugs — RL has
plenty to learn — but its trajectories are uneven, multi-turn and execute real sandboxed commands.

    python -m trl_thundersync.testing.tiny_agent ./tiny-agent
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from .tiny import build_tiny_model, build_tiny_tokenizer

_COMMANDS = (
    "ls", "ls -R", "ls tests", "cat *.py | head -40", "python3 -m pytest -q", "python3 -m pytest -q -x",
    "grep -rn def .", "head -30 README.md", "wc -l *.py", "find . -name '*.py'", "cat tests/*.py | head -30",
    "sed -n 1,20p *.py", "git status", "pwd", "cat input.txt", "ls data",
)
_OBSERVATIONS = ("exit_code: 0\nstdout:\nok", "exit_code: 1\nstdout:\n1 failed, 2 passed in <elapsed>s",
                 "exit_code: 0\nstdout:\nmain.py tests", "exit_code: 2\nstderr:\nNo such file or directory")
_TASKS = ("Fix the bug so that the failing tests pass.", "Make the tests in tests/ pass.",
          "Create the requested file in /workspace.", "Repair the function described in the issue.")


def run_shell(command: str) -> str:
    """Run a shell command in the task workspace (/workspace) and return its exit code and output.

    Args:
        command: The shell command to run.
    """
    raise NotImplementedError("schema only: the environment provides the real tool")


def submit() -> str:
    """Submit the current state of the workspace as the final answer."""
    raise NotImplementedError("schema only: the environment provides the real tool")


def _call(name: str, arguments: dict) -> dict:
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


def _task_prompts() -> list[str]:
    """The bundled suites' own prompts (so the first turn is in distribution), plus a few generic ones."""
    prompts = [f"{task} Use the run_shell tool, then submit." for task in _TASKS]
    try:
        from ..envs.tasks import swe_dataset, terminal_dataset

        for dataset in (swe_dataset(), terminal_dataset()):
            prompts += [row["prompt"][-1]["content"] for row in dataset]
    except Exception as exc:  # the suites are package data; a broken install must not pass silently
        raise RuntimeError(f"could not load the bundled task prompts: {exc}") from exc
    return prompts


def synthetic_transcript(rng: random.Random, prompts: list[str]) -> list[dict]:
    messages = [{"role": "user", "content": rng.choice(prompts)}]
    for _ in range(rng.randint(1, 4)):
        messages.append(_call("run_shell", {"command": rng.choice(_COMMANDS)}))
        messages.append({"role": "tool", "name": "run_shell", "content": rng.choice(_OBSERVATIONS)})
    if rng.random() < 0.8:
        messages.append(_call("submit", {}))
        messages.append({"role": "tool", "name": "submit", "content": "submitted"})
    messages.append({"role": "assistant", "content": rng.choice(("Done.", "Submitted.", "The fix is in place."))})
    return messages


def warm_start(model, tokenizer, steps: int = 300, batch: int = 8, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Supervised warm-start on synthetic tool-use transcripts; returns the loss curve."""
    from trl.chat_template_utils import get_training_chat_template

    template = get_training_chat_template(tokenizer) or tokenizer.chat_template
    rng = random.Random(seed)
    prompts = _task_prompts()
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        rows = [tokenizer.apply_chat_template(synthetic_transcript(rng, prompts), tools=[run_shell, submit],
                                              chat_template=template, tokenize=True, return_dict=True,
                                              return_assistant_tokens_mask=True) for _ in range(batch)]
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((batch, width), tokenizer.pad_token_id)
        labels = torch.full((batch, width), -100)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = torch.tensor(r["input_ids"])
            attention[i, :n] = 1
            mask = torch.tensor(r["assistant_masks"], dtype=torch.bool)
            labels[i, :n] = torch.where(mask, ids[i, :n], torch.tensor(-100))
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def save_tiny_agent_model(path: str | Path, steps: int = 300, seed: int = 0) -> Path:
    """Create (or reuse) the warm-started tiny agent model folder at `path`."""
    path = Path(path)
    if (path / "config.json").exists() and (path / "warm_start.json").exists():
        return path
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed)
    losses = warm_start(model, tokenizer, steps=steps, seed=seed)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    (path / "warm_start.json").write_text(json.dumps({"steps": steps, "seed": seed, "first_loss": losses[0],
                                                      "last_loss": losses[-1]}))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default="tiny-agent")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args(argv)
    out = save_tiny_agent_model(args.path, steps=args.steps)
    print(f"tiny agent model written to {out}: {(out / 'warm_start.json').read_text()}")


if __name__ == "__main__":
    main()
