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


def test_every_line_and_each_schedules_peak():
    plan = plan_memory(SPEC)
    assert lines(plan) == {"framework": 0, "weights": 4 * P, "optimizer state": 8 * P, "gradients": 4 * P,
                           "batch accumulator": 4 * P, "pass gradients": 8 * P, "activations": 0,
                           "batch direction": 4 * P, "group statistics": 4 * 2 * 2 * P, "release buffers": 4 * 16 * P,
                           "activations (TRL)": 0}
    # stock TRL holds its lines at once; a streamed schedule the lines held always plus its larger phase: the passes
    # (pass gradients, statistics, buffers) or the barrier (direction and param.grad). sync learns each group in one
    # pass at its reward: the batch accumulator, no G1/G2, no buffer
    assert (plan.total("trl"), plan.total("sync"), plan.total("thundersync")) == (16 * P, 24 * P, 104 * P)
    assert plan_memory(replace(SPEC, group_passes=False)).total("sync") == 40 * P  # member by member: G1, G2
    # one source of truth with the logged bound (`thundersync/stats_bound_mb`): beyond stock TRL, thundersync holds
    # the streamed state, the pass gradients, and param.grad only at the barrier
    assert plan.total("thundersync") - plan.total("trl") == streamed_state_bytes(
        P, batch_size=16, num_generations=8, open_groups=2, release="content", beta=0.0, max_buffered=None,
        micro_batches=1, router=False, entropy=False, objective_functions=0, off_policy_mask=False) + 8 * P - 4 * P
    assert "thundersync/sync = 4.33x" in plan.table()


def test_phases_measured_framework_activations_and_the_cpu_heap():
    plan = plan_memory(replace(SPEC, release="reward", framework_bytes=100 * P, activation_bytes=3 * P,
                               trl_activation_bytes=7 * P, pass_tokens=64, cpu_heap=True))
    got = lines(plan)
    assert got["framework"] == 100 * P and got["activations"] == 3 * P and got["allocator (CPU)"] == 4 * P
    # sync: always 100 + 4 + 8 + 4 (accumulator) + 4 (heap); passes 8 + 3 > barrier 4 + 4
    assert plan.total("sync") == 131 * P and plan.total("thundersync") == 147 * P  # + G1, G2 of two groups
    assert plan.total("trl") == (100 + 4 + 8 + 4 + 7) * P
    bare = plan_memory(replace(SPEC, release="reward", param_bytes=2, optimizer="sgd"))
    # BF16 without optimizer state: the barrier (4 B direction + 2 B param.grad) is below the passes (2 + 4 B)
    assert bare.total("sync") == (2 + 4) * P + 6 * P
    assert "not measured" in plan_memory(SPEC).table() and "64 tokens" in plan.table()
    assert pending_bytes(plan, "sync") == plan.total("sync") - 104 * P  # the framework is resident already


def test_activation_estimate_matches_what_autograd_saves():
    """The closed form of `memory/activations.py` against the bytes `saved_tensors_hooks` sees in real Qwen3 passes
    (SDPA, FP32), within 10%, for two shapes and two lengths."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from trl_thundersync.memory.activations import ModelShape, pass_activation_bytes

    for hidden, intermediate, heads, kv, layers, length in ((64, 128, 4, 2, 2, 24), (96, 384, 6, 3, 3, 40)):
        config = Qwen3Config(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate,
                             num_attention_heads=heads, num_key_value_heads=kv, head_dim=16, num_hidden_layers=layers,
                             tie_word_embeddings=True, attn_implementation="sdpa")
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).train()
        saved: dict[int, int] = {}

        def pack(tensor, saved=saved):
            base = tensor._base if tensor._base is not None else tensor
            saved[id(base)] = base.numel() * base.element_size()
            return tensor

        ids = torch.randint(0, 256, (2, length))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        parameters = {id(p) for p in model.parameters()}
        measured = sum(n for key, n in saved.items() if key not in parameters)
        planned = pass_activation_bytes(ModelShape.from_config(config), 2 * length, 0, 4)
        assert abs(planned - measured) <= 0.10 * measured, (hidden, planned, measured)
    assert pass_activation_bytes(None, 100, 10, 4) == 0


def test_the_trainer_measures_the_framework_on_the_cpu_only():
    from trl_thundersync.trainers.grpo.memory import framework_bytes, longest_prompt

    assert framework_bytes([], "cpu") > 0 and framework_bytes([], "cuda:0") == 0 and framework_bytes([], None) == 0
    assert longest_prompt(None, None) == 0


def test_longest_prompt_reads_plain_and_chat_prompts(tmp_path):
    from transformers import AutoTokenizer

    from trl_thundersync.tiny.model import save_tiny_model
    from trl_thundersync.trainers.grpo.memory import longest_prompt

    tokenizer = AutoTokenizer.from_pretrained(save_tiny_model(tmp_path / "m"))
    plain = [{"prompt": "a b"}, {"prompt": "a b c d e f g"}]
    assert longest_prompt(plain, tokenizer) == len(tokenizer("a b c d e f g")["input_ids"])
    chat = [{"prompt": [{"role": "user", "content": "hello there"}]}]
    rendered = tokenizer.apply_chat_template(chat[0]["prompt"], add_generation_prompt=True, tokenize=True)
    rendered = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
    assert longest_prompt(chat, tokenizer) == len(rendered) > 0
    assert longest_prompt([{"text": "no prompt"}], tokenizer) == 0
    assert longest_prompt(plain * 100, tokenizer, rows=1) == len(tokenizer("a b")["input_ids"])


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
    # 8.2 M (the ladder's 10m): 384 MiB beyond sync holds both groups' G1, G2 (16·P), then 8 buffers of 4·P
    ten = replace(SPEC, total_params=8_164_608, trainable_params=8_164_608)
    assert chosen(ten, "auto") == (None, (AUTO_FLOOR - 16 * 8_164_608) // (4 * 8_164_608), "content")
    assert chosen(ten, "auto")[1] == 8
    # the 42.9 M model: one open group's G1, G2 (8·P = 343 MB) fit 384 MiB, two do not; no buffer fits
    # beside them: reward release
    large = replace(SPEC, total_params=42_874_112, trainable_params=42_874_112)
    caps = choose_caps(large, "auto")
    assert (caps.max_open_groups, caps.max_buffered_trajectories, caps.release) == (1, None, "reward")
    assert "no release buffer" in caps.reason
    planned = plan_memory(replace(large, max_open_groups=1, release="reward"))
    assert planned.total("thundersync") - planned.total("sync") == 8 * 42_874_112
    # 100 M: 25% of sync's planned bytes is more than the floor, yet one group's G1, G2 do not fit: kept anyway
    huge = replace(SPEC, total_params=94_918_272, trainable_params=94_918_272)
    assert AUTO_FLOOR < 0.25 * plan_memory(replace(huge, max_open_groups=1, release="reward")).total("sync")
    assert chosen(huge, "auto") == (1, None, "reward")
    assert chosen(replace(large, max_buffered_trajectories=5, max_open_groups=2), "auto") == (None, 5, "content")
    assert chosen(large, None) == (None, None, "content")


def test_a_budget_in_bytes_chooses_groups_then_buffers_and_falls_back_to_reward_release():
    one_group = 4 * 3 * P  # the streamed state: batch accumulator, G1, G2
    assert chosen(SPEC, one_group + 4 * P) == (1, 1, "content")
    assert chosen(SPEC, one_group + 4 * P - 1) == (1, None, "reward")
    assert chosen(SPEC, 4 * 5 * P + 4 * 7 * P) == (None, 7, "content")  # both groups, then 7 buffers
    # activations, the framework and the CPU heap are not the streamed state: the same caps with them
    measured = replace(SPEC, framework_bytes=10**9, activation_bytes=10**8, cpu_heap=True)
    assert chosen(measured, one_group + 4 * P) == (1, 1, "content")
    with pytest.raises(MemoryPlanError, match=r"memory_budget=11,999 bytes cannot hold .* 1 open group.*peft_config"):
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
    with pytest.raises(MemoryPlanError, match=r"needs .* MB more on cpu \(optimizer state .*gradients .*release "
                                              r"buffers .*max_open_groups, max_buffered_trajectories"):
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


def test_the_papers_layout_moves_the_streamed_state_to_the_host_and_shards_the_optimizer():
    """Planned only (issue 40, the paper's §4.3): 4 ranks, ZeRO-1 FP32 moments, the FP32 streamed state on the host,
    each pass's gradients staged there parameter by parameter."""
    spec = replace(SPEC, param_bytes=2, release="reward", optimizer_shards=4, optimizer_state_bytes=4,
                   host_state=True, largest_param=P // 10)
    plan = plan_memory(spec)
    where = {line.name: line.where for line in plan.lines}
    assert {name for name, w in where.items() if w == "host"} == {"batch accumulator", "batch direction",
                                                                    "group statistics"}
    got = lines(plan)
    assert got["optimizer state"] == 2 * 4 * P // 4 and got["gradients"] == 4 * P // 4
    assert got["pass gradients"] == 2 * (P // 10) * 2
    # the device: weights + optimizer shard + the larger phase (staging 0.4 P or the step's shard P)
    assert plan.total("sync") == plan.total("thundersync") == 2 * P + 2 * P + P
    assert plan.total("thundersync", "host") == 4 * P + 4 * 2 * 2 * P  # accumulator, G1 and G2 of both groups
    assert plan.total("sync", "host") == 4 * P + 4 * P  # accumulator, and the direction at the barrier
    assert "[host]" in plan.table() and "peak (host)" in plan.table()
    # "auto" bounds what thundersync holds beyond sync on the host: one group's G1, G2 (8 P) fit 384 MiB
    assert chosen(spec, "auto") == (None, None, "reward")
    big = replace(spec, total_params=100_000_000, trainable_params=100_000_000)
    assert chosen(big, "auto") == (1, None, "reward")


def test_gradient_checkpointing_keeps_one_layer_and_each_layers_input():
    from trl_thundersync.memory.activations import ModelShape

    shape = ModelShape(hidden=64, layers=10, intermediate=128, query_width=64, kv_width=32, vocab=100)
    layer = 6.1 * 64 + 4 * (64 + 32 + 128)
    assert shape.per_token_elements() == pytest.approx(10 * layer + 3.3 * 64)
    assert shape.per_token_elements(checkpointed=True) == pytest.approx(10 * 64 + layer + 3.3 * 64)


def test_shared_prefixes_one_for_sync_one_per_open_group_for_thundersync():
    plan = plan_memory(replace(SPEC, release="reward", prefix_bytes=5 * P))
    got = lines(plan)
    assert got["shared prefix"] == 5 * P and got["open prefixes"] == 5 * P  # two groups open: one more prompt
    assert plan.total("sync") == 24 * P + 5 * P and plan.total("thundersync") == 24 * P + 16 * P + 10 * P
    assert "open prefixes" not in lines(plan_memory(replace(SPEC, release="reward", prefix_bytes=5 * P,
                                                            max_open_groups=1)))


def test_the_trainers_spec_plans_a_shared_prefix_only_for_long_prompts(tmp_path):
    from types import SimpleNamespace

    from trl_thundersync.memory.activations import ModelShape, prefix_bytes
    from trl_thundersync.tiny.model import build_tiny_model, build_tiny_tokenizer
    from trl_thundersync.trainers.grpo.memory import memory_spec

    model = build_tiny_model(build_tiny_tokenizer())
    args = SimpleNamespace(batch_group_members=True, num_iterations=1, max_completion_length=32,
                           batch_group_max_tokens=2048, per_device_train_batch_size=8, gradient_checkpointing=False,
                           shared_prefix=True, shared_prefix_min_prompt_tokens=256, optim="adamw_torch",
                           max_open_groups=None, max_buffered_trajectories=None, steps_per_generation=1,
                           off_policy_mask_threshold=None, multi_objective_aggregation="sum_then_normalize")
    common = dict(batch_size=16, num_generations=8, release="reward", beta=0.0, peft=False, sharded=False,
                  replicated=True, entropy_bonus=False, router_aux=False, num_reward_functions=1, device="cpu")
    short = memory_spec(model, args, prompt_tokens=100, **common)
    long = memory_spec(model, args, prompt_tokens=300, **common)
    assert short.prefix_bytes == 0 and short.pass_tokens == 8 * 132
    shape = ModelShape.from_config(model.config)
    assert long.prefix_bytes == prefix_bytes(shape, 300, 4) > 0
    assert long.pass_tokens == 8 * 32  # members forward their completions over the prefix
    assert long.trl_activation_bytes > short.trl_activation_bytes  # TRL forwards the prompt with every member
    assert long.framework_bytes > 0 and long.cpu_heap
