"""The memory plan (`trl_thundersync/memory`): its lines and totals, the caps chosen from a budget, the fit check,
and the command that prints a plan from a model config without loading weights."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trl_thundersync.errors import MemoryPlanError
from trl_thundersync.memory import check_fits, choose_caps, parse_budget, plan_memory
from trl_thundersync.memory.__main__ import main as plan_command
from trl_thundersync.memory.available import pending_bytes
from trl_thundersync.memory.budget import AUTO_FLOOR
from trl_thundersync.memory.plan import MemorySpec
from trl_thundersync.streaming.batch_metrics import streamed_state_bytes

P = 1000
SPEC = MemorySpec(total_params=P, trainable_params=P, param_bytes=4, optimizer="adamw_torch", batch_size=16,
                  num_generations=8, release="content", max_open_groups=None, max_buffered_trajectories=None)


def chosen(spec, budget) -> tuple:
    caps = choose_caps(spec, budget)
    return caps.max_open_groups, caps.max_buffered_trajectories, caps.release


def lines(plan) -> dict[str, int]:
    return {line.name: line.bytes for line in plan.lines}


def test_every_line_and_each_schedules_total():
    plan = plan_memory(SPEC)
    assert lines(plan) == {"weights": 4 * P, "gradients": 4 * P, "optimizer state": 8 * P, "batch accumulator": 4 * P,
                           "group statistics": 4 * 2 * 2 * P, "source gradient": 4 * P, "release buffers": 4 * 16 * P}
    # sync learns each group in one pass at its reward: the batch accumulator, no G1/G2, no buffer
    assert (plan.total("trl"), plan.total("sync"), plan.total("thundersync")) == (16 * P, 20 * P, 104 * P)
    assert plan_memory(replace(SPEC, group_passes=False)).total("sync") == 40 * P  # member by member: G1, G2, H_i
    # one source of truth with the logged bound (`thundersync/stats_bound_mb`), which does not count H_i
    assert plan.total("thundersync") - plan.total("trl") - 4 * P == streamed_state_bytes(
        P, batch_size=16, num_generations=8, open_groups=2, release="content", beta=0.0, max_buffered=None,
        micro_batches=1, router=False, entropy=False, objective_functions=0, off_policy_mask=False)
    assert "thundersync/sync = 5.20x" in plan.table()


def test_caps_reference_model_lora_sharding_and_optional_terms():
    capped = plan_memory(replace(SPEC, max_open_groups=1, max_buffered_trajectories=3))
    assert lines(capped)["group statistics"] == 4 * 2 * P and lines(capped)["release buffers"] == 4 * 3 * P
    assert "release buffers" not in lines(plan_memory(replace(SPEC, release="reward")))
    assert lines(plan_memory(replace(SPEC, beta=0.1)))["reference model"] == 4 * P
    lora = plan_memory(replace(SPEC, total_params=10 * P, trainable_params=P, beta=0.1, peft=True))
    assert "reference model" not in lines(lora) and lines(lora)["weights"] == 40 * P
    assert lines(plan_memory(replace(SPEC, sharded=True, beta=0.1)))["sharded replica"] == 2 * 4 * P
    assert lines(plan_memory(replace(SPEC, optimizer="sgd")))["optimizer state"] == 0
    turn = plan_memory(replace(SPEC, release="turn", beta=0.1, entropy_bonus=True, micro_batches=2))
    assert lines(turn)["release buffers"] == 4 * 3 * 16 * P and lines(turn)["optional terms"] == 4 * 2 * P


def test_auto_budget_keeps_small_models_uncapped_and_large_ones_within_a_quarter_of_sync():
    assert chosen(SPEC, "auto") == (None, None, "content")
    # 8.2 M (the ladder's 10m): 384 MiB beyond sync holds both groups' G1, G2 and H_i (20·P), 7 buffers of 4·P
    ten = replace(SPEC, total_params=8_164_608, trainable_params=8_164_608)
    assert chosen(ten, "auto") == (None, (AUTO_FLOOR - 20 * 8_164_608) // (4 * 8_164_608), "content")
    assert chosen(ten, "auto")[1] == 7
    # the 42.9 M model: one open group's G1, G2 and H_i (12·P = 514 MB) exceed 384 MiB; kept anyway, with
    # no buffer: reward release
    large = replace(SPEC, total_params=42_874_112, trainable_params=42_874_112)
    caps = choose_caps(large, "auto")
    assert (caps.max_open_groups, caps.max_buffered_trajectories, caps.release) == (1, None, "reward")
    assert "no release buffer" in caps.reason
    planned = plan_memory(replace(large, max_open_groups=1, release="reward"))
    assert planned.total("thundersync") - planned.total("sync") == 12 * 42_874_112
    # 100 M: 25% of sync's planned bytes is more than the floor, yet one group's G1, G2 do not fit: kept anyway
    huge = replace(SPEC, total_params=94_918_272, trainable_params=94_918_272)
    assert chosen(huge, "auto") == (1, None, "reward")
    assert chosen(replace(large, max_buffered_trajectories=5, max_open_groups=2), "auto") == (None, 5, "content")
    assert chosen(large, None) == (None, None, "content")


def test_a_budget_in_bytes_chooses_groups_then_buffers_and_falls_back_to_reward_release():
    one_group = 4 * 4 * P  # batch accumulator + G1 + G2 + H_i
    assert chosen(SPEC, one_group + 4 * P) == (1, 1, "content")
    assert chosen(SPEC, one_group + 4 * P - 1) == (1, None, "reward")
    assert chosen(SPEC, 4 * 6 * P + 4 * 7 * P) == (None, 7, "content")  # both groups, then 7 buffers
    with pytest.raises(MemoryPlanError, match=r"memory_budget=15,999 bytes cannot hold .* 1 open group.*peft_config"):
        choose_caps(SPEC, one_group - 1)
    with pytest.raises(MemoryPlanError, match="lower max_open_groups"):
        choose_caps(replace(SPEC, max_open_groups=2), one_group)


@pytest.mark.parametrize("value, expected", [("auto", "auto"), (None, None), (2_000_000, 2_000_000),
                                             ("2GB", 2 * 10**9), ("512MiB", 512 * 2**20), (" 1.5 gib", 1.5 * 2**30)])
def test_budget_forms(value, expected):
    assert parse_budget(value) == expected


@pytest.mark.parametrize("value", ["lots", "2 parsecs", 0, -1, True, "-3GB"])
def test_bad_budgets_are_refused_naming_the_field(value):
    with pytest.raises(ValueError, match=r"memory_budget="):
        parse_budget(value)


def test_the_fit_check_counts_what_is_still_to_allocate_and_names_the_fields():
    plan = plan_memory(replace(SPEC, beta=0.1))  # weights and the reference are resident when the trainer is built
    assert pending_bytes(plan, "thundersync") == plan.total("thundersync") - 8 * P
    check_fits(plan, "thundersync", pending_bytes(plan, "thundersync"))
    with pytest.raises(MemoryPlanError, match=r"needs .* MB more on cpu \(gradients .*release buffers .*max_open_groups"
                                              r", max_buffered_trajectories"):
        check_fits(plan, "thundersync", pending_bytes(plan, "thundersync") - 1)
    check_fits(plan, "sync", pending_bytes(plan, "sync"))  # sync holds no release buffer
    with pytest.raises(MemoryPlanError, match="even stock TRL's gradients and optimizer state do not fit"):
        check_fits(plan, "sync", 4 * P)


def test_the_command_prints_a_plan_from_a_config_without_weights(tmp_path, capsys):
    config = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=512,
                  tie_word_embeddings=True, dtype="bfloat16")
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "run.yaml").write_text("per_device_train_batch_size: 4\nnum_generations: 2\nrelease: reward\n")
    assert plan_command(["--model", str(tmp_path), "--config", str(tmp_path / "run.yaml")]) == 0
    out = capsys.readouterr().out
    full = int(out.split(" parameters")[0].split(": ")[-1].replace(",", ""))
    assert f"{full:,} trainable, 2 B each; 4 trajectories per process, groups of 2" in out
    assert "release buffers" not in out and "group statistics" in out  # release read from the YAML
    assert plan_command(["--model", str(tmp_path / "config.json"), "--lora_r", "4", "--release", "content",
                         "--dtype", "float32"]) == 0
    lora = capsys.readouterr().out
    # rank 4 on every linear layer but the tied head: q 64→64, k/v 64→32, o 64→64, MLP 64→128 ×2, 128→64
    adapter = 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64))
    assert f"{full + adapter:,} parameters, {adapter:,} trainable, 4 B each" in lora and "release buffers" in lora


def test_zero3_partitioned_parameters_and_nothing_trainable():
    """DeepSpeed ZeRO-3 partitions parameters when the model is built (`numel()` 0, `ds_numel` the real count)."""
    import torch

    from trl_thundersync.trainers.grpo.memory import numel

    partitioned = torch.nn.Parameter(torch.empty(0))
    partitioned.ds_numel = 1234
    assert numel(partitioned) == 1234 and numel(torch.nn.Parameter(torch.empty(3, 4))) == 12
    assert chosen(replace(SPEC, trainable_params=0), 1000) == (None, None, "content")  # buffers cost nothing
