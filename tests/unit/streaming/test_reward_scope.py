"""`reward_scope`: when reward functions are called, on which rows, and the "auto" probe (fakes, no model)."""

from __future__ import annotations

import math

import pytest
import torch

from trl_thundersync.errors import RewardFunctionError, RewardScopeError
from trl_thundersync.streaming.reward_scope import RewardStage, ScopeProbe, plain_reward_functions, values_agree
from trl_thundersync.streaming.rewards import RewardContext, RewardScorer, ScoringInput
from trl_thundersync.types import Rollout

G, B = 2, 6


def rollout(i):
    return Rollout(index=i, group=i // G, policy_version=0, prompt_ids=(1,), completion_ids=(5,) * (i + 1),
                   completion="x" * (i + 1), extra_fields={"extra": f"e{i}"})


class Recorder:
    """A reward function that records every call's kwargs and returns len(completion) (per-sample)."""

    def __init__(self, transform=None):
        self.calls = []
        self.transform = transform
        self.__name__ = "recorded"

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        self.calls.append(dict(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs))
        values = [float(len(c)) for c in completions]
        return self.transform(values) if self.transform else values


def centered(values):
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def context():
    return RewardContext(trainer_state="state", log_extra=lambda c, v: None, log_metric=lambda n, v: None)


def stage(scope, *funcs, probe=None, envs=False):
    scorer = RewardScorer(list(funcs), [getattr(f, "__name__", "f") for f in funcs], torch.ones(len(funcs)))

    def prepare(r):
        return ScoringInput(r, f"prompt{r.group}", {"prompt": "p", "answer": f"a{r.index}"},
                            f"env{r.index}" if envs else None)

    return RewardStage(scorer, scope, batch_size=B, num_generations=G, prepare=prepare, context=context(),
                       probe=probe)


ARRIVAL = [3, 0, 5, 2, 1, 4]  # completion order: group 1 closes first (3, 2), then group 0 (0, 1), then group 2


def released(st):
    return [[s.rollout.index for s in st.add(rollout(i))] for i in ARRIVAL]


def test_trajectory_scope_releases_each_trajectory_at_once():
    f = Recorder()
    assert released(stage("trajectory", f)) == [[i] for i in ARRIVAL]
    assert [c["completions"] for c in f.calls] == [["x" * (i + 1)] for i in ARRIVAL]


def test_group_scope_calls_once_per_group_in_row_order_when_its_last_member_ends():
    f = Recorder()
    assert released(stage("group", f, envs=True)) == [[], [], [], [2, 3], [0, 1], [4, 5]]
    assert len(f.calls) == 3
    call = f.calls[0]  # group 1, rows 2 and 3, in row order although 3 finished first
    assert call["prompts"] == ["prompt1", "prompt1"]
    assert call["completion_ids"] == [[5] * 3, [5] * 4]
    assert call["answer"] == ["a2", "a3"] and call["extra"] == ["e2", "e3"] and "prompt" not in call
    assert call["environments"] == ["env2", "env3"] and call["trainer_state"] == "state"
    assert callable(call["log_extra"]) and callable(call["log_metric"])


def test_batch_scope_is_one_call_over_the_batch_in_row_order():
    f = Recorder(centered)
    st = stage("batch", f)
    assert released(st) == [[], [], [], [], [], [0, 1, 2, 3, 4, 5]]
    assert len(f.calls) == 1 and f.calls[0]["answer"] == [f"a{i}" for i in range(B)]
    assert "environments" not in f.calls[0]


def test_batch_scope_values_are_the_batch_call_values():
    st = stage("batch", Recorder(centered))
    out = [s for i in ARRIVAL for s in st.add(rollout(i))]
    assert [s.reward for s in out] == [float(i + 1) - 3.5 for i in range(B)]
    assert len({s.scored_at for s in out}) == 1  # one ready time: the call's end


BAD = {"short": lambda v: v[:-1], "scalar": lambda v: 7.0, "raises": lambda v: 1 / 0}


@pytest.mark.parametrize("scope, rows, where", [
    ("group", G, r"group 1 \(trajectories 2\.\.3\)"),
    ("batch", B, r"the generation batch \(trajectories 0\.\.5, groups 0\.\.2\)"),
])
@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_group_and_batch_calls_name_the_function_and_the_call(scope, rows, where, bad):
    what = {"short": f"returned {rows - 1} rewards for {rows} completions", "scalar": "returned float",
            "raises": "raised ZeroDivisionError"}[bad]
    with pytest.raises(RewardFunctionError, match=f"reward function 'recorded' {what}.* on {where}"):
        released(stage(scope, Recorder(BAD[bad])))


def test_values_agree_is_tight_and_nan_equals_only_nan():
    assert values_agree([1.0, math.nan], [1.0, math.nan])
    assert not values_agree([1.0, math.nan], [1.0, 0.0])
    assert not values_agree([0.0, 0.0], [0.0, 1e-5])
    assert values_agree([1000.0, 1.0], [1000.0 + 5e-4, 1.0])  # a few float32 ULPs of the group's scale
    assert not values_agree([1000.0, 1.0], [1000.0 + 5e-3, 1.0])


def test_auto_probe_refuses_a_call_dependent_function_when_the_first_group_closes():
    plain, dependent = Recorder(), Recorder(centered)
    dependent.__name__ = "centered_len"
    st = stage("auto", plain, dependent, probe=ScopeProbe([0, 1]))
    assert [[s.rollout.index for s in st.add(rollout(i))] for i in ARRIVAL[:1]] == [[3]]  # released at once
    with pytest.raises(RewardScopeError, match="'centered_len' depends on the other completions.* group 1 "
                       r"\(trajectories 2\.\.3\).*\[0, 0\].*\[-0\.5, 0\.5\].*reward_scope='group'.*'batch'.*"
                       "reward_scope='trajectory'"):
        st.add(rollout(2))


def test_auto_probe_runs_once_per_run_and_only_on_plain_functions():
    plain, exempt = Recorder(), Recorder(centered)  # index 1 is exempt (a reward model or an env get_reward)
    probe = ScopeProbe([0])
    for _ in range(2):  # two batches share the trainer's probe
        st = stage("auto", plain, exempt, probe=probe)
        assert released(st) == [[i] for i in ARRIVAL]
    probe_calls = [c for c in plain.calls if len(c["completions"]) == G]
    assert len(probe_calls) == 1 and probe_calls[0]["completion_ids"] == [[5] * 3, [5] * 4]
    assert all(len(c["completions"]) == 1 for c in exempt.calls)
    assert ScopeProbe([]).done


def test_plain_reward_functions_skip_reward_models_and_environment_rewards():
    model = torch.nn.Linear(1, 1)
    assert plain_reward_functions([len, model, sum, max], num_user_funcs=3) == [0, 2]
