"""A tiny *agent* model: the offline tiny Qwen3 warm-started to call tools, so CPU examples have real multi-turn work.

A random-weight model never emits a tool call, so an agentic example on it would run one turn per trajectory and
learn from identical rewards. Here the tiny model is fine-tuned for a few hundred steps (under a minute on two
cores, once; the result is cached in a folder) on synthetic transcripts in the chat template's tool-call format:
inspect the repository, run the tests, maybe look again, submit. It knows nothing about fixing bugs — RL has
plenty to learn — but its trajectories are uneven, multi-turn and execute real sandboxed commands.

    python -m trl_thundersync.tiny.agent ./tiny-agent
    python -m trl_thundersync.tiny.agent ./tiny-agent-thermostat --suite thermostat   # + the suite's transcripts

A suite's own warm start (`envs.suites.Suite.warm_start`, a `WarmStart`: its prompt, tools and synthetic episodes,
and the share of steps on them) is passed as `save_tiny_agent_model(path, suite=...)`; the tiny agent knows no suite
by name.

Cost: a transcript is ~1,400 tokens, ~85% of them the prompt (system block with the tool schemas, then the task),
and the loss covers only the ~150 assistant tokens; forward and backward are nearly all the time (rendering the chat
template is ~2 ms a transcript). So each step draws one prompt and 8 tool-use episodes for it: the prompt is
forwarded once, each episode runs over a copy of the prompt's key/value cache, and one backward goes through all of
them — the loss and gradient a padded batch of the 8 full transcripts gives, up to FP32 rounding
(`tests/unit/tiny/test_tiny_agent.py`), at a fifth of the cost.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..envs.suites.record import WarmStart
from ..envs.suites.transcripts import tool_call
from .model import build_tiny_model, build_tiny_tokenizer, built_shape, folder_has_shape

# Bump whenever a change to the recipe below (data, batching, optimizer, steps) changes the built weights: a folder
# is reused only if its warm_start.json names this recipe, steps and seed (the build cache key) and its config.json
# has the shape `build_tiny_model` gives now (`model.folder_has_shape`: heads, head size, width, depth).
# 1: padded batches of 8 transcripts with 8 prompts. 2: 8 transcripts sharing one prompt, forwarded once.
RECIPE = 2
TINY_AGENT_LAYERS = 2  # depth of every tiny agent build
MARKER = "warm_start.json"  # written last: a folder without it (or with another key) is rebuilt

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
    """A user turn with one of `prompts`, then a synthetic tool-use episode (`tool_use_episode`)."""
    return [{"role": "user", "content": rng.choice(prompts)}, *tool_use_episode(rng)]


def tool_use_episode(rng: random.Random) -> list[dict]:
    """What the agent is taught to do after the task: 1–4 shell commands with canned observations, usually a
    submit, then a short final message."""
    messages = []
    for _ in range(rng.randint(1, 4)):
        messages.append(tool_call("run_shell", {"command": rng.choice(_COMMANDS)}))
        messages.append({"role": "tool", "name": "run_shell", "content": rng.choice(_OBSERVATIONS)})
    if rng.random() < 0.8:
        messages.append(tool_call("submit", {}))
        messages.append({"role": "tool", "name": "submit", "content": "submitted"})
    messages.append({"role": "assistant", "content": rng.choice(("Done.", "Submitted.", "The fix is in place."))})
    return messages


@dataclass(frozen=True)
class PromptBatch:
    """The transcripts of one warm-start step, tokenized: one shared prompt and each transcript's continuation."""

    prompt_ids: tuple[int, ...]  # the rendered prompt (system block with the tools, the user's task), shared by all
    continuation_ids: tuple[tuple[int, ...], ...]  # per transcript: its tokens after the prompt
    labels: tuple[tuple[int, ...], ...]  # per transcript, aligned with continuation_ids: the token where the
    #   template's assistant mask is 1, else -100 (prompt and tool responses are context only)
    label_count: int  # Σ labelled tokens over the batch: the token-mean loss's denominator


def render_batch(tokenizer, template: str, prompt: str, episodes: Sequence[list[dict]],
                 tools: Sequence | None = None) -> PromptBatch:
    """Render `prompt` + each episode with the chat template and split off the shared prompt tokens. `tools`: the
    schemas in the system block (default: this module's `run_shell` and `submit`).

    Raises RuntimeError if the template does not render the prompt as a token prefix of every transcript, or
    marks the first continuation token as assistant output (the loss would then need the prompt's last logits)."""
    tools = [run_shell, submit] if tools is None else list(tools)
    user = [{"role": "user", "content": prompt}]
    prompt_ids = tokenizer.apply_chat_template(user, tools=tools, chat_template=template, tokenize=True,
                                               return_dict=True)["input_ids"]
    n = len(prompt_ids)
    continuations, labels = [], []
    for episode in episodes:
        row = tokenizer.apply_chat_template(user + episode, tools=tools, chat_template=template, tokenize=True,
                                            return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = row["input_ids"], row["assistant_masks"]
        if ids[:n] != prompt_ids or any(mask[: n + 1]):
            raise RuntimeError("the chat template does not render the prompt as a prefix of the transcript; "
                               "the shared-prompt warm start needs a prefix-preserving template")
        continuations.append(tuple(ids[n:]))
        labels.append(tuple(t if m else -100 for t, m in zip(ids[n:], mask[n:], strict=True)))
    return PromptBatch(tuple(prompt_ids), tuple(continuations), tuple(labels),
                       sum(t != -100 for row in labels for t in row[1:]))


def batch_loss(model, batch: PromptBatch) -> torch.Tensor:
    """Token-mean cross-entropy of the batch's labelled tokens, graph-attached (the prompt forwarded once).

    Each continuation runs over its own cache holding the prompt's key/value states (not detached: the gradient
    flows back into the one prompt forward). Continuation position t predicts its token t + 1; its first token
    (the assistant header) is never a label, so the prompt's logits are not needed."""
    from transformers import DynamicCache

    from ..streaming.segment_backward import model_logits

    device = next(model.parameters()).device
    prompt = DynamicCache()
    model_logits(model, batch.prompt_ids, device, prompt, keep=1)
    total = torch.zeros((), device=device)
    for ids, labels in zip(batch.continuation_ids, batch.labels, strict=True):
        cache = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in prompt.layers])
        logits = model_logits(model, ids, device, cache)
        targets = torch.tensor(labels[1:], device=device)
        total = total + torch.nn.functional.cross_entropy(logits[:-1].float(), targets, ignore_index=-100,
                                                          reduction="sum")
    return total / batch.label_count


def warm_start(model, tokenizer, steps: int = 300, batch: int = 8, lr: float = 3e-3, seed: int = 0,
               progress: bool = False, suite: WarmStart | None = None) -> list[float]:
    """Supervised warm-start on synthetic tool-use transcripts (`batch` per step, one prompt each step); returns
    the loss curve. `progress`: a tqdm bar on stderr. `suite` (a suite's `WarmStart`, `Suite.warm_start(...)`): its
    share of the steps draw the suite's prompt, tools and episodes, the others generic tool use (`tool_use_episode`).

    Runs on one intra-op thread: the ops of a 64-wide model are too small to split (two threads were no faster
    idle and several times slower on a busy machine), and the weights then do not depend on the core count."""
    from tqdm.auto import tqdm
    from trl.chat_template_utils import get_training_chat_template

    template = get_training_chat_template(tokenizer) or tokenizer.chat_template
    rng = random.Random(seed)
    prompts = _task_prompts()
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model.train()
    losses = []
    suite_tools = list(suite.tools()) if suite is not None else None
    try:
        bar = tqdm(range(steps), desc="tiny agent warm start (first run only)", unit="step", disable=not progress)
        for _ in bar:
            if suite is not None and (suite.share is None or rng.random() < suite.share):
                episodes = [suite.episode(rng) for _ in range(batch)]
                prompt, tools = suite.prompt, suite_tools
            else:
                prompt, tools = rng.choice(prompts), None
                episodes = [tool_use_episode(rng) for _ in range(batch)]
            loss = batch_loss(model, render_batch(tokenizer, template, prompt, episodes, tools))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    finally:
        torch.set_num_threads(threads)
        model.eval()
    return losses


def built_with(path: str | Path) -> dict | None:
    """The build record (warm_start.json) of a complete tiny agent folder, or None."""
    path = Path(path)
    if not ((path / "config.json").exists() and (path / MARKER).exists()):
        return None
    try:
        return json.loads((path / MARKER).read_text())
    except json.JSONDecodeError:
        return None


def save_tiny_agent_model(path: str | Path, steps: int = 300, seed: int = 0, progress: bool = False,
                          suite: WarmStart | None = None, hidden_size: int | None = None) -> Path:
    """Create the warm-started tiny agent model folder at `path`, or reuse it if it was built with this recipe,
    `steps`, `seed`, suite warm start and width (anything else is rebuilt in place). `progress`: a tqdm bar while
    building. `suite`: also (or only) warm-start on a suite's transcripts — a `WarmStart` from the suite's record,
    e.g. `get_suite("thermostat").warm_start()`; the default build is generic tool use. `hidden_size`: the model's
    width (`build_tiny_model`; default: the suite warm start's, else 64)."""
    hidden_size = hidden_size or (suite.hidden_size if suite is not None else 64)
    path = Path(path)
    key = {"recipe": RECIPE, "steps": steps, "seed": seed, **(dict(suite.key) if suite else {}),
           **({"hidden_size": hidden_size} if hidden_size != 64 else {})}
    record = built_with(path)
    built = None if record is None else {k: v for k, v in record.items() if k not in ("first_loss", "last_loss")}
    if built == key and folder_has_shape(path, built_shape(hidden_size, TINY_AGENT_LAYERS)):
        return path
    (path / MARKER).unlink(missing_ok=True)  # a half-rebuilt folder must not pass for a built one
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=TINY_AGENT_LAYERS, seed=seed)
    losses = warm_start(model, tokenizer, steps=steps, seed=seed, progress=progress, suite=suite)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    (path / MARKER).write_text(json.dumps({**key, "first_loss": losses[0], "last_loss": losses[-1]}))
    return path


def main(argv: list[str] | None = None) -> None:
    from ..envs.suites import get_suite, registered_suites

    with_warm_start = [s.name for s in registered_suites() if s.warm_start is not None]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default="tiny-agent")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--suite", choices=with_warm_start, default=None,
                        help="warm-start on this suite's transcripts too (default: generic tool use only)")
    args = parser.parse_args(argv)
    warm = get_suite(args.suite).warm_start() if args.suite else None
    out = save_tiny_agent_model(args.path, steps=args.steps, progress=True, suite=warm)
    print(f"tiny agent model written to {out}: {(out / MARKER).read_text()}")


if __name__ == "__main__":
    main()
