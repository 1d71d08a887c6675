"""Token-level parity of agent_protocol="trl" with stock trl.GRPOTrainer's own tool loop.

Both sides get the same scripted model: a turn's action is a function of the decoded context only. Stock TRL runs
`_generate` (first turn, `parse_response`, `_tool_call_loop`) with `_generate_single_turn` replaced by the script;
ThunderSync runs its agent engine over `ScriptedTurnGenerator`. Prompt ids, completion ids, tool masks, the messages
handed to reward functions and the tool-call counts must be equal, trajectory by trajectory.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from benchmarks.parity import cpu_config, load_model
from benchmarks.scripted import ScriptedTurnGenerator, tool_call_text
from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

pytestmark = pytest.mark.slow


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return a + b


def explode(reason: str) -> str:
    """Always fails.

    Args:
        reason: why
    """
    raise ValueError(f"boom: {reason}")


def echo(text: str) -> str:
    """Echo a text.

    Args:
        text: what to return
    """
    return text


async def fetch(key: str) -> str:
    """Fetch a value.

    Args:
        key: which
    """
    await asyncio.sleep(0.001)
    return f"value-of-{key}"


TOOLS = [add, explode, echo, fetch]


def call(name: str, **arguments) -> str:
    return tool_call_text(name, arguments)


SCRIPTS = {  # task -> one action per turn (the last one repeats)
    0: [call("add", a=1, b=2) + "\n" + call("add", a=3, b=4), "Both sums done."],  # two calls in one turn
    1: [call("explode", reason="x") + "\n" + call("nope") + "\n" + call("add", a=1), "Errors seen."],  # failures
    2: ['<tool_call>\n{"name": "add", "arguments": {"a": \n</tool_call>', "never"],  # unparsable: episode ends
    3: ["No tool needed: 42."],  # no call
    4: [call("fetch", key="k") + "\n" + call("add", a=5, b=5), call("echo", text="again"), "Fetched."],  # async
    5: [call("echo", text="word " * 120), "never"],  # the result overflows max_completion_length: dropped
    6: [call("add", a=1, b=1)],  # calls forever: max_tool_calling_iterations ends it
    7: [call("echo", text="short"), call("add", a=2, b=2) + " and more text " * 30],  # cut by the budget
}


def script(index, turn, context: str) -> str:
    task = int(re.search(r"Task (\d+)\.", context).group(1))
    actions = SCRIPTS[task]
    turn = context.count("<|im_start|>assistant") - 1  # from the context alone: the same on both sides
    return actions[min(turn, len(actions) - 1)]


def rows():
    return [{"prompt": [{"role": "user", "content": f"Task {i}. Use the tools."}]} for i in SCRIPTS]


def zero(completions, **kwargs):
    return [0.0] * len(completions)


COMMON = dict(max_completion_length=300, max_tool_calling_iterations=3, per_device_train_batch_size=8,
              num_generations=2, max_steps=1)


def stock_trl_episodes(tmp_path, tokenizer, model_path):
    args = cpu_config(GRPOConfig, tmp_path / "trl", **COMMON)
    trainer = GRPOTrainer(model=load_model(model_path), reward_funcs=[zero], args=args,
                          train_dataset=Dataset.from_list(rows()), processing_class=tokenizer, tools=TOOLS)
    eos = tokenizer.eos_token_id

    def scripted_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for ids in prompt_ids:  # TRL's generation caps every call at max_completion_length; the loop slices after
            action = tokenizer.encode(script(None, None, tokenizer.decode(list(ids))), add_special_tokens=False)
            out.append((action + [eos])[: args.max_completion_length])
        return out, None

    trainer._generate_single_turn = scripted_turn
    counts = {}
    loop = trainer._tool_call_loop

    def counting_loop(*a, **k):
        result = loop(*a, **k)
        counts["calls"], counts["failures"] = result[4], result[5]
        return result

    trainer._tool_call_loop = counting_loop
    inputs = rows()
    # what _generate_and_score_completions does before _generate: the per-rollout tool dicts
    trainer._sync_tool_dicts = [{t.__name__: t for t in TOOLS if not asyncio.iscoroutinefunction(t)}] * len(inputs)
    trainer._async_tool_dicts = [{t.__name__: t for t in TOOLS if asyncio.iscoroutinefunction(t)}] * len(inputs)
    prompt_ids, completion_ids, tool_mask, completions, *_ = trainer._generate([x["prompt"] for x in inputs])
    return prompt_ids, completion_ids, tool_mask, completions, counts


def thundersync_episodes(tmp_path, tokenizer, model_path):
    args = cpu_config(ThunderSyncGRPOConfig, tmp_path / "ts", **COMMON)
    assert args.agent_protocol == "trl"  # the default
    trainer = ThunderSyncGRPOTrainer(model=load_model(model_path), reward_funcs=[zero], args=args,
                                     train_dataset=Dataset.from_list(rows()), processing_class=tokenizer, tools=TOOLS)
    engine = trainer._agent_engine(ScriptedTurnGenerator(tokenizer, script))
    inputs = rows()
    engine.start_batch(trainer._requests(inputs, [x["prompt"] for x in inputs], 0), 0)
    rollouts = sorted(engine.results(), key=lambda r: r.index)
    engine.close()
    return rollouts


def test_episodes_equal_stock_trl_token_for_token(tmp_path, tokenizer, tiny_model_path):
    prompt_ids, completion_ids, tool_mask, completions, counts = stock_trl_episodes(tmp_path, tokenizer,
                                                                                    tiny_model_path)
    rollouts = thundersync_episodes(tmp_path, tokenizer, tiny_model_path)
    for i, rollout in enumerate(rollouts):
        assert list(rollout.prompt_ids) == list(prompt_ids[i]), f"task {i}: prompt ids"
        assert list(rollout.completion_ids) == list(completion_ids[i]), f"task {i}: completion ids"
        assert list(rollout.env_mask) == list(tool_mask[i]), f"task {i}: tool mask"
        assert rollout.completion == completions[i], f"task {i}: messages handed to reward functions"
    assert sum(r.agent.tool_calls for r in rollouts) == counts["calls"]
    assert sum(r.agent.tool_failures for r in rollouts) == counts["failures"]
    # the script exercised what it claims to: several calls in a turn, a dropped result, the iteration cap, a cut
    stops = {r.index: r.agent.stop_reason for r in rollouts}
    assert stops == {0: "answered", 1: "answered", 2: "answered", 3: "answered", 4: "answered",
                     5: "max_completion_length", 6: "max_tool_calling_iterations", 7: "max_completion_length"}
    assert rollouts[0].agent.tool_calls == 2 and rollouts[6].agent.turns == 4
    # task 7: the cut last turn still parses, its call runs (TRL counts it) and its result is dropped
    assert rollouts[7].agent.tool_calls == 2 and rollouts[7].completion_ids[-1] != tokenizer.eos_token_id


LOGGED = ("completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
          "completions/mean_terminated_length", "completions/min_terminated_length",
          "completions/max_terminated_length", "tools/call_frequency", "tools/failure_frequency", "num_tokens")


def test_logged_lengths_and_tool_metrics_equal_stock_trl(tmp_path, tokenizer, tiny_model_path):
    """One training step each on the same scripted episodes: the metrics TRL logs from `_generate` — lengths in
    model tokens (tool mask 1, not the tool results), truncation, tool counts, tokens seen — log the same values."""
    trl_args = cpu_config(GRPOConfig, tmp_path / "trl", **COMMON)
    stock = GRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[zero], args=trl_args,
                        train_dataset=Dataset.from_list(rows()), processing_class=tokenizer, tools=TOOLS)
    eos = tokenizer.eos_token_id

    def scripted_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for ids in prompt_ids:
            action = tokenizer.encode(script(None, None, tokenizer.decode(list(ids))), add_special_tokens=False)
            out.append((action + [eos])[: trl_args.max_completion_length])
        return out, None

    stock._generate_single_turn = scripted_turn
    stock.train()
    ts_args = cpu_config(ThunderSyncGRPOConfig, tmp_path / "ts", **COMMON)
    ours = ThunderSyncGRPOTrainer(model=load_model(tiny_model_path), reward_funcs=[zero], args=ts_args,
                                  train_dataset=Dataset.from_list(rows()), processing_class=tokenizer, tools=TOOLS)
    ours.use_turn_generator(ScriptedTurnGenerator(tokenizer, script))
    ours.train()
    expected = next(h for h in stock.state.log_history if "completions/mean_length" in h)
    logged = next(h for h in ours.state.log_history if "completions/mean_length" in h)
    assert expected["tools/call_frequency"] > 0 and expected["completions/clipped_ratio"] > 0  # tools ran, cuts too
    assert {k: logged.get(k) for k in LOGGED} == pytest.approx({k: expected[k] for k in LOGGED}), (
        "the same episodes must log what stock TRL logs")
