"""Suite selection (`envs.suites.load_suite`), the length-shaping reward and the example scripts' flags
(`examples_support.arguments`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from trl import ModelConfig, ScriptArguments, TrlParser

from trl_thundersync.envs.suites import load_suite
from trl_thundersync.errors import ConfigurationError
from trl_thundersync.examples_support.arguments import (
    LENGTH_PENALTY,
    LengthShapingArguments,
    SuiteArguments,
    TinyTeacherArguments,
    length_shaping,
    shorter_is_better,
)


@pytest.mark.parametrize("name", ["swe", "terminal"])
def test_load_suite_pairs_tasks_dataset_and_environment(name):
    full = load_suite(name)
    suite = load_suite(name, num_tasks=2)
    assert list(suite.tasks) == list(full.tasks)[:2]
    assert [row["task_id"] for row in suite.dataset] == list(suite.tasks)
    env = suite.environment_factory()
    assert env.kind == name and env._task_map() == suite.tasks
    assert suite.environment_factory() is not env, "one fresh environment per call"
    assert len(load_suite(name, num_tasks=0).tasks) == len(full.tasks), "0 means all, as --num_tasks did"


def test_load_suite_refuses_unknown_suites_and_swe_rows_for_terminal():
    with pytest.raises(ConfigurationError, match="suite='web'"):
        load_suite("web")
    with pytest.raises(ConfigurationError, match="swe_rows"):
        load_suite("terminal", swe_rows="rows.jsonl")


def test_length_shaping_sets_weights_only_when_the_user_gave_none():
    assert shorter_is_better([[1, 2, 3], []]) == [-3.0, -0.0]
    args = SimpleNamespace(reward_weights=None)
    assert length_shaping(0.0, args) == [] and args.reward_weights is None
    assert length_shaping(0.01, args) == [shorter_is_better] and args.reward_weights == [0.01]
    mine = SimpleNamespace(reward_weights=[2.0, 1.0])
    assert length_shaping(0.01, mine) == [shorter_is_better] and mine.reward_weights == [2.0, 1.0]


def _own_flags(*dataclasses) -> set[str]:
    """The parser's flags for the fields these dataclasses add to TRL's ScriptArguments."""
    trl_fields = set(ScriptArguments.__dataclass_fields__)
    own = {f"--{n}" for cls in dataclasses for n in cls.__dataclass_fields__ if n not in trl_fields}
    return {s for a in TrlParser(dataclasses)._actions for s in a.option_strings} & own


def test_the_examples_keep_their_suite_flags():
    """The flags the agentic examples had before their suite part moved into the library, plus `--suite` (the swe and
    terminal twins merged behind it)."""
    assert _own_flags(SuiteArguments) == {"--suite", "--tiny_model_dir", "--num_tasks", "--swe_rows",
                                          "--swe_repo_root"}
    assert _own_flags(LengthShapingArguments) == {"--length_penalty"}
    assert _own_flags(TinyTeacherArguments) == {"--tiny_teacher_dir"}


def test_an_example_parser_reads_suite_and_shaping_flags():
    from trl_thundersync import ThunderSyncGRPOConfig

    parser = TrlParser((SuiteArguments, LengthShapingArguments, ThunderSyncGRPOConfig, ModelConfig))
    suite_args, shaping_args, training_args, _ = parser.parse_args_and_config(
        ["--num_tasks", "3", "--swe_rows", "r.jsonl", "--output_dir", "out", "--use_cpu", "true", "--bf16", "false"])
    assert (suite_args.num_tasks, suite_args.swe_rows, suite_args.tiny_model_dir) == (3, "r.jsonl", "tiny-agent")
    assert suite_args.suite == "swe"
    assert shaping_args.length_penalty == LENGTH_PENALTY
    assert training_args.output_dir == "out"


def test_the_suite_flag_picks_the_suite_and_its_own_tiny_agent_folder():
    parser = TrlParser((SuiteArguments,))
    (terminal,) = parser.parse_args_and_config(["--suite", "terminal"])
    assert terminal.load_suite().name == "terminal" and terminal.tiny_model_dir == "tiny-agent"
    (thermostat,) = parser.parse_args_and_config(["--suite", "thermostat"])
    assert thermostat.tiny_model_dir == "tiny-agent-thermostat"  # not the generic folder, rebuilt
    (mine,) = parser.parse_args_and_config(["--suite", "thermostat", "--tiny_model_dir", "here"])
    assert mine.tiny_model_dir == "here"
    with pytest.raises(ConfigurationError, match="suite='web'"):
        parser.parse_args_and_config(["--suite", "web"])
