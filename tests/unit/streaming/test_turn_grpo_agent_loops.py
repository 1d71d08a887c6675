"""The TurnEvents both agent loops emit are exactly their final Rollout's token history, also at the token limits, so
`TurnScoreBackward` learns their trajectories per turn (no fallback) and equals `TrajectoryBackward`."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from benchmarks.scripted import tool_call_text
from tests.fixtures.tools import add, echo
from trl_thundersync.envs.harness.agent_loop import AgentLimits, run_agent_trajectory
from trl_thundersync.envs.harness.tool_calls import ToolResponseRenderer
from trl_thundersync.envs.harness.tool_messages import ToolMessagesRenderer
from trl_thundersync.envs.harness.trl_tool_loop import TRLLoopLimits, run_trl_trajectory
from trl_thundersync.streaming.importance import SamplingCorrection
from trl_thundersync.streaming.normalization import LossNormalization
from trl_thundersync.streaming.source import TrajectoryBackward
from trl_thundersync.streaming.turn_grpo import TurnScoreBackward
from trl_thundersync.tiny.model import build_tiny_model
from trl_thundersync.types import Rollout, ScoredRollout

TOOLS = {"add": add, "echo": echo}


@pytest.fixture(scope="module")
def setup(tokenizer):
    from trl.chat_template_utils import get_training_chat_template

    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, seed=3)
    add_fused_lm_head(model)  # as GRPOTrainer.__init__ does
    model.train()
    template = get_training_chat_template(tokenizer)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "go"}], tools=list(TOOLS.values()),
                                           add_generation_prompt=True, tokenize=True, return_dict=False,
                                           chat_template=template)
    return model, template, list(prompt)


def _generate(tokenizer, actions):
    def generate(context, max_new_tokens, turn):
        ids = (tokenizer.encode(actions[turn], add_special_tokens=False) + [tokenizer.eos_token_id])
        ids = ids[: max_new_tokens + 2]  # the TRL loop cuts what the engine over-generates itself
        return tuple(ids), tuple(-1.0 - 0.05 * k for k in range(len(ids))), 0

    return generate


def _rollout(traj) -> Rollout:  # as rollout/agent_engine.py builds it
    return Rollout(index=0, group=0, policy_version=traj.policy_version, prompt_ids=tuple(traj.prompt_ids),
                   completion_ids=tuple(traj.completion_ids), env_mask=tuple(traj.env_mask),
                   sampling_logprobs=tuple(traj.logprobs), truncated=traj.truncated)


def _backwards(model, tokenizer, mask_truncated):
    params = [p for p in model.parameters() if p.requires_grad]
    fn = GRPOTrainer._get_per_token_logps_and_entropies.__wrapped__
    owner = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext))

    def logps(ids, mask, keep):  # the trainer's logps_fn: TRL's own
        return fn(owner, model, ids, mask, keep)[0]

    common = dict(params=params, normalization=LossNormalization("grpo", 1, 1, 512),
                  eos_and_pad=(tokenizer.eos_token_id, tokenizer.pad_token_id), mask_truncated=mask_truncated,
                  correction=SamplingCorrection("token_truncate", None, 3.0))
    return TrajectoryBackward(logps_fn=logps, **common), TurnScoreBackward(model=model, **common)


CALL = tool_call_text("add", {"a": 1, "b": 2})
LONG = tool_call_text("echo", {"text": "x " * 60})


def _paper(tokenizer, setup, runner, actions, limits):
    model, template, prompt = setup
    events = []
    traj = run_agent_trajectory(index=0, prompt_ids=prompt, tools=TOOLS, generate=_generate(tokenizer, actions),
                                tokenizer=tokenizer, render_tool=ToolResponseRenderer(tokenizer, template),
                                run_tool=runner, limits=limits, on_turn=events.append)
    return traj, events


def _trl(tokenizer, setup, runner, actions, limits):
    model, template, prompt = setup
    events = []
    traj = run_trl_trajectory(index=0, prompt_ids=prompt, tools=TOOLS, generate=_generate(tokenizer, actions),
                              tokenizer=tokenizer, render_tools=ToolMessagesRenderer(tokenizer, template),
                              run_tool=runner, limits=limits, on_turn=events.append)
    return traj, events


def _episodes(tokenizer, prompt_len):
    n = len(tokenizer.encode(CALL)) + 1
    return {
        "paper answered": (_paper, [CALL, CALL, "done"], AgentLimits(max_turns=4)),
        "paper max_turns": (_paper, [CALL] * 3, AgentLimits(max_turns=2)),
        "paper turn cut": (_paper, [CALL, CALL], AgentLimits(max_turns=4, max_completion_tokens=n + 3)),
        "paper window": (_paper, [CALL] * 4, AgentLimits(max_turns=4, max_context_tokens=prompt_len + n + 5)),
        "trl answered": (_trl, [CALL, CALL, "done"], TRLLoopLimits(max_completion_length=400)),
        "trl turn cut": (_trl, [CALL, CALL], TRLLoopLimits(max_completion_length=n + 30)),
        "trl result dropped": (_trl, [LONG, "never"], TRLLoopLimits(max_completion_length=len(tokenizer.encode(LONG))
                                                                     + 20)),
        "trl iterations": (_trl, [CALL] * 3, TRLLoopLimits(max_completion_length=400, max_tool_calling_iterations=1)),
    }


@pytest.mark.parametrize("case", ["paper answered", "paper max_turns", "paper turn cut", "paper window",
                                  "trl answered", "trl turn cut", "trl result dropped", "trl iterations"])
@pytest.mark.parametrize("mask_truncated", [False, True])
def test_loop_turns_are_the_rollout(tokenizer, setup, runner, case, mask_truncated):
    loop, actions, limits = _episodes(tokenizer, len(setup[2]))[case]
    traj, events = loop(tokenizer, setup, runner, actions, limits)
    rollout = _rollout(traj)
    offset = len(rollout.prompt_ids)
    for e in events:  # each event carries the sampler's log-probs of its action, as the rollout records them
        start = len(e.context_ids) - offset
        assert e.action_logprobs == rollout.sampling_logprobs[start : start + len(e.action_ids)]
    whole, turns = _backwards(setup[0], tokenizer, mask_truncated)
    for event in events:
        turns.turn(event)
    ours = turns.finish(rollout, 0)
    assert ours is not None, turns.fallbacks
    expected = whole(ScoredRollout(rollout, (1.0,), 1.0, 0.0), 0)
    assert ours.scored_tokens == expected.scored_tokens
    if expected.score_grad is None:
        assert ours.score_grad is None and mask_truncated
    else:
        assert float((ours.score_grad - expected.score_grad).norm() / expected.score_grad.norm()) <= 1e-5
