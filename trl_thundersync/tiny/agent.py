"""A tiny *agent* model: the offline tiny Qwen3 warm-started to call tools, so CPU examples have real multi-turn work.

A random-weight model never emits a tool call, so an agentic example on it would run one turn per trajectory and
learn from identical rewards. Here the tiny model is fine-tuned for a few hundred steps (under a minute on two
cores, once; the result is cached in a folder) on synthetic transcripts in the chat template's tool-call format:
inspect the repository, run the tests, maybe look again, submit. It knows nothing about fixing bugs — RL has
plenty to learn — but its trajectories are uneven, multi-turn and execute real sandboxed commands.

    python -m trl_thundersync.tiny.agent ./tiny-agent

Cost: a transcript is ~1,400 tokens, ~85% of them the prompt (system block with the tool schemas, then the task),
and the loss covers only the ~150 assistant tokens; forward and backward are nearly all the time (rendering the chat
template is ~2 ms a transcript). So each step draws one prompt and 8 tool-use episodes for it: the prompt is
forwarded once, each episode runs over a copy of the prompt's key/value cache, and one backward goes through all of
them — the loss and gradient a padded batch of the 8 full transcripts gives, up to FP32 rounding
(`tests/unit/tiny/test_tiny_agent.py`), at a fifth of the cost.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigurationError
from .model import build_tiny_model, build_tiny_tokenizer, built_shape, folder_has_shape

# Bump whenever a change to the recipe below (data, batching, optimizer, steps) changes the built weights: a folder
# is reused only if its warm_start.json names this recipe, steps and seed (the build cache key) and its config.json
# has the shape `build_tiny_model` gives now (`model.folder_has_shape`: heads, head size, width, depth).
# 1: padded batches of 8 transcripts with 8 prompts. 2: 8 transcripts sharing one prompt, forwarded once.
RECIPE = 2
LOOKUP_SHARE = 1.0  # share of the lookup build's warm-start steps on the lookup suite (the others: tool use)
# The lookup build (issue 15 probes, 300 steps on 2 cores; BENCHMARKS.md "Issue 15"): at width 64 the warm start
# never learned to copy a pointer (teacher-forced p(named directory) stayed at chance even with every episode
# following); at 128 with every episode following it did in one of three builds (this one: seed 0, the suite's
# directory names; held-out success 0.46); with 40-50% following, in none.
LOOKUP_HIDDEN = 128  # width of the lookup example's model
LOOKUP_FOLLOW = 1.0  # share of the lookup warm start's episodes that follow their pointers (`lookup_episode`)
# The thermostat build (issue 15; BENCHMARKS.md "Time to quality"): width 64, 300 steps, every episode a thermostat
# one, half of its actions the reactive rule's. With no following (0.0) RL at lr 1e-3 lost the tool-call format
# within 3 steps; with a quarter, the reward rose more slowly than this build's within the quickstart's budget.
THERMOSTAT_FOLLOW = 0.5  # share of the thermostat warm start's actions that follow the rule (`thermostat_episode`)
TINY_AGENT_LAYERS = 2  # depth of every tiny agent build
MARKER = "warm_start.json"  # written last: a folder without it (or with another key) is rebuilt

_COMMANDS = (
    "ls", "ls -R", "ls tests", "cat *.py | head -40", "python3 -m pytest -q", "python3 -m pytest -q -x",
    "grep -rn def .", "head -30 README.md", "wc -l *.py", "find . -name '*.py'", "cat tests/*.py | head -30",
    "sed -n 1,20p *.py", "git status", "pwd", "cat input.txt", "ls data",
)
_OBSERVATIONS = ("exit_code: 0\nstdout:\nok", "exit_code: 1\nstdout:\n1 failed, 2 passed in <elapsed>s",
                 "exit_code: 0\nstdout:\nmain.py tests", "exit_code: 2\nstderr:\nNo such file or directory")
_LOOKUP_SUBMITTED = "Submitted. The episode is over; your work will now be graded."  # the environment's reply
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
    """A user turn with one of `prompts`, then a synthetic tool-use episode (`tool_use_episode`)."""
    return [{"role": "user", "content": rng.choice(prompts)}, *tool_use_episode(rng)]


def lookup_episode(rng: random.Random, follow: bool = False) -> list[dict]:
    """An episode in the lookup suite's format (`envs.tasks.lookup`): `cat input.txt`, then shell commands drawn
    from the suite's pointers, then submit, with observations shaped as the suite's sandbox prints them.

    `follow=False` teaches the format only: each command is independent of what the observation before it named, so
    such a policy follows a chain only by chance. `follow=True` teaches the skill: a chain of 1-3 distinct hops that
    is not a held-out multi-hop chain (`lookup_warm_chains`), each command the one the previous observation named,
    submit when it names submit — the warm start mixes both (`lookup_follow`) so RL starts from a policy that
    sometimes succeeds and has the conditioning to amplify."""
    from ..envs.tasks.lookup import DECOYS, POINTERS, SUBMIT

    choices = (*POINTERS, SUBMIT)
    if follow:
        chain = rng.choice(lookup_warm_chains())
        shown, commands = (*chain, SUBMIT), chain
    else:
        commands = []
        for _ in range(rng.randint(1, 4)):
            command = rng.choice(choices)
            if command == SUBMIT:
                break
            commands.append(command)
        shown = tuple(rng.choice(choices) for _ in range(len(commands) + 1))
    messages = _lookup_read(rng, shown[0])
    for command, pointer in zip(commands, shown[1:], strict=True):
        listing = sorted([f"next: {pointer}", *rng.sample(DECOYS, rng.randint(0, 2))])
        messages.append(_call("run_shell", {"command": command}))
        messages.append({"role": "tool", "name": "run_shell",
                         "content": "exit_code: 0\nstdout:\n" + "\n".join(listing)})
    messages.append(_call("submit", {}))
    messages.append({"role": "tool", "name": "submit", "content": _LOOKUP_SUBMITTED})
    messages.append({"role": "assistant", "content": rng.choice(("Done.", "Submitted."))})
    return messages


def thermostat_episode(rng: random.Random, follow: float = 0.0,
                       distances: tuple[int, ...] | None = None) -> list[dict]:
    """An episode in the thermostat suite's format (`envs.tasks.thermostat`): `./check`, then up to 5 actions, each
    the reactive rule's (high → ./down, low → ./up, ok → submit) with probability `follow`, else one of the three
    drawn uniformly; every observation is what the dial's scripts print for the level the actions so far reached
    (from a start level `distances` away from the target; default: the train split's). `follow=0` teaches the
    format and the dynamics only: the commands ignore the observations, so such a policy solves a task by chance, and
    RL has the association to learn. `follow=1` from every distance (train and held-out) is a policy that has the
    skill: the distillation benchmark's teacher."""
    from ..envs.tasks.thermostat import CHECK, DOWN, MOVES, SUBMIT, TRAIN_DISTANCES, UP, status_line

    level = rng.choice(distances or TRAIN_DISTANCES) * rng.choice((1, -1))
    messages = [_call("run_shell", {"command": CHECK}), _shell_result(status_line(level))]
    for _ in range(5):
        right = SUBMIT if level == 0 else (DOWN if level > 0 else UP)
        action = right if rng.random() < follow else rng.choice((UP, DOWN, SUBMIT))
        if action == SUBMIT:
            messages.append(_call("submit", {}))
            messages.append({"role": "tool", "name": "submit", "content": _LOOKUP_SUBMITTED})
            break
        level += MOVES[action]
        messages += [_call("run_shell", {"command": action}), _shell_result(status_line(level))]
    messages.append({"role": "assistant", "content": rng.choice(("Done.", "Submitted."))})
    return messages


def _shell_result(stdout: str) -> dict:
    return {"role": "tool", "name": "run_shell", "content": f"exit_code: 0\nstdout:\n{stdout}"}


def _lookup_read(rng: random.Random, pointer: str) -> list[dict]:
    """The episode's first call and what it shows: `cat input.txt` naming `pointer` (with the suite's wordings)."""
    from ..envs.tasks.lookup import START

    text = rng.choice(("", "Start here.\n", "Follow the pointers.\n")) + f"next: {pointer}"
    return [_call("run_shell", {"command": START}),
            {"role": "tool", "name": "run_shell", "content": f"exit_code: 0\nstdout:\n{text}"}]


@functools.cache
def lookup_warm_chains() -> tuple[tuple[str, ...], ...]:
    """The chains a following warm-start episode may walk: every chain of 1-3 distinct pointers except the held-out
    split's multi-hop chains, so held-out success on those measures generalization, not recall."""
    from ..envs.tasks.lookup import POINTERS, load_lookup_suite

    held = {t.chain for t in load_lookup_suite("heldout").values() if len(t.chain) > 1}
    return tuple(c for n in (1, 2, 3) for c in itertools.permutations(POINTERS, n) if c not in held)


def _lookup_tools() -> list:
    """The lookup environment's own tools, so the warm-start system block is the one its rollouts show."""
    from ..envs.environments.lookup import LookupTaskEnv

    env = LookupTaskEnv(tasks={})
    return [env.run_shell, env.submit]


def _thermostat_tools() -> list:
    """The thermostat environment's own tools (its system block is the one its rollouts show)."""
    from ..envs.environments.thermostat import ThermostatTaskEnv

    env = ThermostatTaskEnv(tasks={})
    return [env.run_shell, env.submit]


def tool_use_episode(rng: random.Random) -> list[dict]:
    """What the agent is taught to do after the task: 1–4 shell commands with canned observations, usually a
    submit, then a short final message."""
    messages = []
    for _ in range(rng.randint(1, 4)):
        messages.append(_call("run_shell", {"command": rng.choice(_COMMANDS)}))
        messages.append({"role": "tool", "name": "run_shell", "content": rng.choice(_OBSERVATIONS)})
    if rng.random() < 0.8:
        messages.append(_call("submit", {}))
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
               progress: bool = False, lookup: bool = False, lookup_follow: float = 0.0,
               lookup_share: float = 0.5, thermostat_follow: float | None = None,
               thermostat_distances: tuple[int, ...] | None = None) -> list[float]:
    """Supervised warm-start on synthetic tool-use transcripts (`batch` per step, one prompt each step); returns
    the loss curve. `progress`: a tqdm bar on stderr. `lookup`: a `lookup_share` of the steps draw the lookup
    suite's prompt and `lookup_episode`s, the others as without it; each of those episodes follows its pointers with
    probability `lookup_follow` (0: the format only). `thermostat_follow` (not None): every step draws the
    thermostat suite's prompt and `thermostat_episode(follow=thermostat_follow, distances=thermostat_distances)`s
    instead.

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
    lookup_tools = _lookup_tools() if lookup else None
    thermostat_tools = _thermostat_tools() if thermostat_follow is not None else None
    try:
        bar = tqdm(range(steps), desc="tiny agent warm start (first run only)", unit="step", disable=not progress)
        for _ in bar:
            if thermostat_follow is not None:
                from ..envs.tasks.thermostat import THERMOSTAT_INSTRUCTION

                episodes = [thermostat_episode(rng, thermostat_follow, thermostat_distances) for _ in range(batch)]
                prompt, tools = THERMOSTAT_INSTRUCTION, thermostat_tools
            elif lookup and rng.random() < lookup_share:
                from ..envs.tasks.lookup import LOOKUP_INSTRUCTION

                episodes = [lookup_episode(rng, follow=rng.random() < lookup_follow) for _ in range(batch)]
                prompt, tools = LOOKUP_INSTRUCTION, lookup_tools
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
                          lookup: bool = False, lookup_follow: float = LOOKUP_FOLLOW,
                          lookup_share: float = LOOKUP_SHARE, hidden_size: int = 64, thermostat: bool = False,
                          thermostat_follow: float = THERMOSTAT_FOLLOW,
                          thermostat_distances: tuple[int, ...] | None = None) -> Path:
    """Create the warm-started tiny agent model folder at `path`, or reuse it if it was built with this recipe,
    `steps`, `seed` and suite options (anything else is rebuilt in place). `progress`: a tqdm bar while building.
    `lookup`: also warm-start on the lookup suite, a `lookup_follow` share of its episodes following the pointers
    (`warm_start`); the default build is unchanged. `thermostat`: warm-start on the thermostat suite only, a
    `thermostat_follow` share of the actions the reactive rule's, from start levels `thermostat_distances` away
    (default: the train split's). `hidden_size`: the model's width
    (`build_tiny_model`; the lookup example uses LOOKUP_HIDDEN)."""
    for name, value in (("lookup_follow", lookup_follow), ("lookup_share", lookup_share),
                        ("thermostat_follow", thermostat_follow)):
        if not 0.0 <= value <= 1.0:
            raise ConfigurationError(f"{name}={value} is not a probability in [0, 1]")
    if thermostat_distances is not None and not (thermostat_distances and all(
            isinstance(d, int) and d > 0 for d in thermostat_distances)):
        raise ConfigurationError(f"thermostat_distances={thermostat_distances!r} must be positive integers")
    if thermostat_distances is not None and not thermostat:
        raise ConfigurationError("thermostat_distances applies to the thermostat build: pass thermostat=True")
    if lookup and thermostat:
        raise ConfigurationError("lookup=True and thermostat=True: a tiny agent is warm-started for one suite")
    path = Path(path)
    key = {"recipe": RECIPE, "steps": steps, "seed": seed,
           **({"lookup": True, "lookup_follow": lookup_follow, "lookup_share": lookup_share} if lookup else {}),
           **({"thermostat": True, "thermostat_follow": thermostat_follow} if thermostat else {}),
           **({"thermostat_distances": list(thermostat_distances)} if thermostat and thermostat_distances else {}),
           **({"hidden_size": hidden_size} if hidden_size != 64 else {})}
    record = built_with(path)
    same = record is not None and all(record.get(k) == v for k, v in key.items())
    if (same and record.get("lookup", False) == lookup and record.get("thermostat", False) == thermostat
            and record.get("hidden_size", 64) == hidden_size
            and record.get("thermostat_distances") == key.get("thermostat_distances")
            and folder_has_shape(path, built_shape(hidden_size, TINY_AGENT_LAYERS))):
        return path
    (path / MARKER).unlink(missing_ok=True)  # a half-rebuilt folder must not pass for a built one
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=hidden_size, num_layers=TINY_AGENT_LAYERS, seed=seed)
    losses = warm_start(model, tokenizer, steps=steps, seed=seed, progress=progress, lookup=lookup,
                        lookup_follow=lookup_follow, lookup_share=lookup_share,
                        thermostat_follow=thermostat_follow if thermostat else None,
                        thermostat_distances=thermostat_distances)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    (path / MARKER).write_text(json.dumps({**key, "first_loss": losses[0], "last_loss": losses[-1]}))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default="tiny-agent")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lookup", action="store_true", help="also warm-start on the lookup suite's format")
    parser.add_argument("--thermostat", action="store_true", help="warm-start on the thermostat suite only")
    args = parser.parse_args(argv)
    out = save_tiny_agent_model(args.path, steps=args.steps, progress=True, lookup=args.lookup,
                                thermostat=args.thermostat)
    print(f"tiny agent model written to {out}: {(out / MARKER).read_text()}")


if __name__ == "__main__":
    main()
