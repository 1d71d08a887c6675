"""benchmarks/realgen.py's pure logic: the overlap bound and the per-schedule table (no runs)."""

from types import SimpleNamespace

import pytest

from benchmarks.realgen import bound, format_rows, parse_args, realgen_rows
from benchmarks.stats import Comparison


def test_bound_is_one_plus_rho_over_max_one_rho():
    assert bound(0.0) == 1.0
    assert bound(0.45) == pytest.approx(1.45)
    assert bound(1.0) == 2.0
    assert bound(4.0) == pytest.approx(1.25)
    with pytest.raises(ValueError):
        bound(-0.1)


def _summary(wall, rollout, learner, tail, turn_busy=None):
    return SimpleNamespace(step_wall_s=wall, rollout_s=rollout, learner_busy_s=learner,
                           balance_ratio=learner / rollout, learner_tail_s=tail, turn_busy_s=turn_busy,
                           turn_idle_s=None)


def test_rows_use_the_sync_rho_for_the_bound_and_leave_the_distillation_run_out_of_speedups():
    stats = {"sync": _summary(10.0, 8.0, 2.0, 2.0), "thundersync:content": _summary(8.0, 8.0, 2.0, 0.2, 1.0),
             "gkd": _summary(6.0, 5.0, 1.0, 0.5)}
    cmp = Comparison(speedup={"sync": 1.0, "thundersync:content": 1.25}, predicted_speedup=1.2,
                     measured_speedup_step=1.25, measured_speedup_trace=1.25, prediction_gap=0.04,
                     primary="thundersync:content", predicted_from_sync={"thundersync:content": 1.2},
                     overlap_vs_sync={"thundersync:content": {
                         "turn_busy_vs_sync": {"relative": 0.08, "seconds": 0.1, "pairs": 5}}})
    rows = {r["schedule"]: r for r in realgen_rows(stats, cmp)}
    assert rows["sync"]["bound"] == pytest.approx(1.25)  # ρ = 2/8 from the sync runs
    assert rows["thundersync:content"]["of_bound"] == pytest.approx(1.0)
    assert rows["thundersync:content"]["tail_frac"] == pytest.approx(0.2 / 8.0)
    assert rows["thundersync:content"]["turn_busy_vs_sync"] == 0.08
    assert rows["thundersync:content"]["prediction_gap"] == pytest.approx(1.25 / 1.2 - 1)
    assert rows["gkd"]["speedup"] is None and rows["gkd"]["bound"] is None and rows["gkd"]["tail_s"] == 0.5
    lines = format_rows(list(rows.values()), stats["sync"].balance_ratio)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "+8.0% (+100.0 ms, n=5)" in lines[3]


def test_schedules_are_checked():
    assert parse_args(["--schedules", "sync,gkd"]).schedules == ("sync", "gkd")
    with pytest.raises(SystemExit):
        parse_args(["--schedules", "sync,thundersync:late"])


def test_distillation_traces_are_summarized_without_release_replay():
    """A ThunderSyncGKDTrainer trace has no rewards: stats.summarize (which replays the GRPO release points) refuses
    it, summarize_distill gives R, L, ρ and the tail."""
    from benchmarks.realgen import summarize_distill
    from benchmarks.stats import RunSteps, summarize
    from trl_thundersync.trace.records import StepTrace, TraceEvent

    events = (TraceEvent("rollout", "trajectory", 0.0, 2.0, index=0),
              TraceEvent("rollout", "turn", 0.0, 1.0, index=0, turn=0),
              TraceEvent("learner", "turn_backward", 1.0, 1.5, index=0, turn=0, ready=1.0),
              TraceEvent("learner", "context_replay", 2.0, 2.5, index=0, ready=2.0),
              TraceEvent("barrier", "optimizer", 2.5, 2.6))
    step = StepTrace(step=1, schedule="thundersync", start=0.0, rollout_end=2.0, learner_end=2.5, barrier_end=2.6,
                     publish_end=2.6, events=events)
    run = RunSteps(walls=(2.6,), traces=(step,), peak_rss_mb=1.0, peak_rss_with_children_mb=1.0, cpu_cores_used=1.0,
                   foreign_cpu_cores=0.0)
    with pytest.raises(ValueError):
        summarize([run])
    s = summarize_distill([run])
    assert (s.rollout_s, s.learner_busy_s, s.learner_tail_s) == pytest.approx((2.0, 1.0, 0.5))
    assert s.balance_ratio == pytest.approx(0.5)


def test_episode_rows_report_step_one_and_all_steps_per_grpo_schedule():
    from benchmarks.realgen import episode_log, episode_rows, format_episode_rows

    history = [{"loss": 0.1, "completions/mean_length": 70.0, "completions/max_length": 120.0,
                "completions/clipped_ratio": 0.0, "tools/call_frequency": 1.0, "step_time": 1.0},
               {"train_runtime": 5.0},  # the end-of-training entry has no completion metrics
               {"completions/mean_length": 90.0, "tools/call_frequency": 2.0}]
    log = episode_log(history)
    assert log == [{"completions/mean_length": 70.0, "completions/max_length": 120.0,
                    "completions/clipped_ratio": 0.0, "tools/call_frequency": 1.0},
                   {"completions/mean_length": 90.0, "tools/call_frequency": 2.0}]
    runs = {"sync": [{"episodes": log}, {"episodes": [{"completions/mean_length": 80.0,
                                                       "tools/call_frequency": 1.5}]}],
            "trl": [{}],  # a report from before this field: skipped
            "gkd": [{"episodes": log}]}  # not a GRPO episode: skipped
    rows = episode_rows(runs)
    assert [r["schedule"] for r in rows] == ["sync"]
    row = rows[0]
    assert row["runs"] == 2 and row["step1_model_tokens"] == pytest.approx(75.0)
    assert row["model_tokens"] == pytest.approx(80.0) and (row["model_tokens_min"], row["model_tokens_max"]) == (70, 90)
    assert row["tool_calls"] == pytest.approx(1.5)
    lines = format_episode_rows(rows)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "| sync | 2 | 75.0 | 80.0 (70.0–90.0) | 1.50 |" == lines[2]


# --- workloads, engines and schedule names (issue 25) ----------------------------------------------------------------


def test_schedule_names_carry_their_engine_and_plain_thundersync_is_the_configs_default_release():
    from benchmarks.realgen_workloads import DEFAULT_RELEASE, parse_schedule
    from trl_thundersync.trainers.grpo.config import ThunderSyncGRPOConfig

    assert DEFAULT_RELEASE == ThunderSyncGRPOConfig.__dataclass_fields__["release"].default
    s = parse_schedule("thundersync@vllm")
    assert (s.name, s.base, s.engine, s.label) == ("thundersync:content@vllm", "thundersync:content", "managed_vllm",
                                                   "vllm")
    s = parse_schedule("sync@embedded_server")
    assert (s.name, s.engine) == ("sync@embedded", "embedded_server")
    assert parse_schedule("thundersync:reward@local_process").name == "thundersync:reward@local_process"
    untagged = parse_schedule("sync", "managed_vllm")  # the --rollout-engine default, the name unchanged
    assert (untagged.name, untagged.engine, untagged.tagged) == ("sync", "managed_vllm", False)
    assert parse_schedule("trl", "managed_vllm").engine is None  # stock TRL generates itself
    for bad in ("trl@vllm", "gkd@vllm", "sync@gpu", "thundersync:late@vllm", "sync:content", "async"):
        with pytest.raises(ValueError):
            parse_schedule(bad)


def test_thermostat_cli_defaults_compare_both_engines_and_stock_trl():
    args = parse_args(["--workload", "thermostat", "--rollout-engine", "embedded"])
    assert args.schedules == ("trl", "sync@embedded", "thundersync:content@embedded", "sync@vllm",
                              "thundersync:content@vllm")
    assert args.rollout_engine == "embedded_server" and args.out.endswith("realgen-thermostat.json")
    with pytest.raises(SystemExit):  # the same run twice: untagged sync is sync@embedded here
        parse_args(["--rollout-engine", "embedded", "--schedules", "sync,sync@embedded"])
    with pytest.raises(SystemExit):
        parse_args(["--workload", "thermostat", "--schedules", "sync,gkd"])
    with pytest.raises(SystemExit):
        parse_args(["--rollout-engine", "gpu"])


def test_thermostat_workload_takes_the_examples_config_values(tmp_path):
    """Every setting examples/thermostat_grpo.py passes reaches the benchmark's configs (read from the file, so the
    benchmark follows the example), max_steps stays the example's learning-rate schedule, the engine of the
    schedule reaches ThunderSyncGRPOConfig, and stock TRL gets the same values."""
    from benchmarks.realgen import workload_of
    from benchmarks.realgen_workloads import (
        THERMOSTAT_EXAMPLE,
        config_kwargs,
        example_call,
        grpo_config,
        parse_schedule,
        reward_funcs,
        thermostat_settings,
    )
    from trl_thundersync.envs.suites import get_suite

    positional, example = example_call(THERMOSTAT_EXAMPLE)
    assert positional == ["thermostat"]
    assert thermostat_settings()["model"] == get_suite("thermostat").tiny_agent == "tiny-agent-thermostat"
    w = workload_of(parse_args(["--workload", "thermostat", "--steps", "3"]))
    assert (w.batch, w.group, w.max_completion_length, w.max_tool_calling_iterations) == (
        example["per_device_train_batch_size"], example["num_generations"], example["max_completion_length"],
        example["max_tool_calling_iterations"])
    assert reward_funcs(w) == []  # the environment's reward only
    config = grpo_config(w, parse_schedule("thundersync@vllm"), tmp_path)
    settings = {k: v for k, v in example.items() if k not in ("model_name_or_path", "output_dir")}
    assert {k: getattr(config, k) for k in settings if k != "report_to"} == {
        k: v for k, v in settings.items() if k != "report_to"}
    assert config.max_steps == example["max_steps"] > w.steps  # stopped after w.steps by StopAt
    assert (config.rollout_engine, config.schedule, config.release) == ("managed_vllm", "thundersync", "content")
    assert grpo_config(w, parse_schedule("sync@embedded"), tmp_path).rollout_engine == "embedded_server"
    trl_kwargs = config_kwargs(w, "trl")
    assert all(trl_kwargs[k] == v for k, v in settings.items() if k not in ("report_to", "save_strategy"))
    assert "grading_workers" not in trl_kwargs and "rollout_engine" not in trl_kwargs


def test_engine_groups_compare_each_engine_with_its_own_sync_runs():
    from benchmarks.realgen import engine_groups, grouped_rows
    from benchmarks.realgen_workloads import parse_schedule
    from benchmarks.stats import compare

    names = ["trl", "sync@vllm", "thundersync@vllm", "sync@embedded", "thundersync@embedded"]
    groups = engine_groups([parse_schedule(n) for n in names])
    assert groups == {"vllm": {"sync": "sync@vllm", "thundersync:content": "thundersync:content@vllm"},
                      "embedded": {"sync": "sync@embedded", "thundersync:content": "thundersync:content@embedded"},
                      "": {"trl": "trl"}}
    single = engine_groups([parse_schedule(n) for n in ("sync", "thundersync:reward", "trl")])
    assert single == {"auto": {"sync": "sync", "thundersync:reward": "thundersync:reward", "trl": "trl"}}

    def summary(wall, replay_content=None):  # replay_content: Eq. 14 replay of content release on these steps
        return SimpleNamespace(step_wall_s=wall, rollout_s=4.0, learner_busy_s=2.0, balance_ratio=0.5,
                               learner_tail_s=0.5, turn_busy_s=None, turn_idle_s=None, replay_sync_s=wall,
                               replay_thundersync_s=replay_content or wall, trace_wall_s=wall,
                               replay_release_s={"content": replay_content or wall}, suffix_s=0.0,
                               replay_release_tail_s={"content": 0.0})

    stats = {"trl": summary(12.0), "sync@vllm": summary(6.0, 4.5), "thundersync:content@vllm": summary(4.0),
             "sync@embedded": summary(10.0, 8.0), "thundersync:content@embedded": summary(8.0)}
    cmps = {label: compare({b: stats[n] for b, n in g.items()}) for label, g in groups.items()}
    rows = {r["schedule"]: r for r in grouped_rows(stats, cmps, groups)}
    assert rows["thundersync:content@vllm"]["speedup"] == pytest.approx(1.5)  # vs sync@vllm, not sync@embedded
    assert rows["thundersync:content@embedded"]["speedup"] == pytest.approx(1.25)
    assert rows["thundersync:content@vllm"]["vs_trl"] == pytest.approx(3.0)
    assert rows["thundersync:content@vllm"]["engine"] == "vllm" and rows["trl"]["speedup"] is None
    # each prediction replays its own engine's sync runs: 6/4.5 for vLLM, 10/8 for the embedded server
    assert rows["thundersync:content@vllm"]["predicted_speedup"] == pytest.approx(6.0 / 4.5)
    assert rows["thundersync:content@vllm"]["measured_over_predicted"] == pytest.approx(1.5 / (6.0 / 4.5))
    assert rows["thundersync:content@embedded"]["measured_over_predicted"] == pytest.approx(1.0)
    lines = format_rows(list(rows.values()), {"vllm": 0.5})
    assert all(line.count("|") == lines[0].count("|") for line in lines[1:len(rows) + 2])
    assert "| thundersync:content@vllm | 4.00 | 1.50× | 3.00× |" in "\n".join(lines)
    assert lines[-1] == "\nρ of the bound (vllm): the sync runs' L/R = 0.50, bound 1.50×."


def test_the_thermostat_vllm_preset_runs_realgen_with_the_options_that_apply():
    from benchmarks import __main__ as bench
    from benchmarks.realgen import THERMOSTAT_SCHEDULES

    args = bench.parse_args(["--preset", "thermostat-vllm", "--steps", "4", "--rollout-engine", "vllm"])
    argv = bench.realgen_argv("thermostat-vllm", args)
    parsed = parse_args(argv)  # realgen accepts what the preset passes
    assert parsed.workload == "thermostat" and parsed.steps == 4 and parsed.repeats == 2
    assert parsed.rollout_engine == "managed_vllm"
    assert parsed.schedules == tuple(parse_args(["--workload", "thermostat"]).schedules)
    assert [s.replace(":content", "") for s in parsed.schedules] == list(THERMOSTAT_SCHEDULES)
    with pytest.raises(SystemExit):  # synthetic points script their generation: no engine to choose
        bench.parse_args(["--preset", "quick", "--rollout-engine", "vllm"])
