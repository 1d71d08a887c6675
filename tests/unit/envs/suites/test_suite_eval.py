"""Held-out evaluation with the run's own turn generator (`envs.suites.evaluate.evaluate_suite(generator=...)`): the
agent loop over the suite's sandboxed environments, each turn sampled by the generator — here a scripted one that
plays the thermostat rule (every episode succeeds) or submits at once (none does)."""

from __future__ import annotations

from benchmarks.scripted import ScriptedTurnGenerator, tool_call_text
from trl_thundersync.envs.suites.evaluate import evaluate_suite


def _rule(index: int, turn: int, context: str) -> str:
    """The thermostat rule, read from the last tool response in the context."""
    last = context.rsplit("status: ", 1)
    if turn == 0 or len(last) == 1:
        return tool_call_text("run_shell", {"command": "./check"})
    status = last[1].split()[0]
    if status.startswith("ok"):
        return tool_call_text("submit", {})
    return tool_call_text("run_shell", {"command": "./down" if status.startswith("high") else "./up"})


def test_held_out_episodes_are_sampled_by_the_generator_and_graded(tokenizer):
    solver = ScriptedTurnGenerator(tokenizer, _rule)
    try:
        result = evaluate_suite(None, tokenizer, "thermostat", split="heldout", samples=2, max_turns=12,
                                generator=solver)
    finally:
        solver.close()
    episodes = result.episodes
    assert episodes >= 2 and episodes % 2 == 0 and result.success == 1.0 and result.mean_reward == 1.0
    keys = [key for key, _ in solver.requests]
    assert {key[0] for key in keys} == {("heldout", n) for n in range(episodes)}  # (trajectory, turn) keys
    assert {budget for _, budget in solver.requests} == {48}  # evaluate_suite's max_tokens_per_turn

    idle = ScriptedTurnGenerator(tokenizer, lambda index, turn, context: tool_call_text("submit", {}))
    try:
        assert evaluate_suite(None, tokenizer, "thermostat", samples=1, generator=idle).success == 0.0
    finally:
        idle.close()
