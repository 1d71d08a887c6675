"""The GRPO trainer's memory plan: built once the model is in hand, before the settings and the first rollout.

`settle_memory` reads the model's parameter counts and the run's fields into a `MemorySpec`, chooses the caps left
at None from `memory_budget` (writing them into the config, as the fields the learner reads), logs the plan, and
refuses a run whose pending bytes exceed the memory free on its device (`trl_thundersync.memory`). `check_trainable`
refuses a model whose trainable parameters changed after the plan (a PEFT adapter added, layers unfrozen), since
every cap was sized for the planned count.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from accelerate.utils import DistributedType

from ...errors import MemoryPlanError
from ...memory.activations import ModelShape, plan_passes
from ...memory.available import check_fits, current_resident_bytes, free_bytes, peak_resident_bytes
from ...memory.budget import Caps, choose_caps, parse_budget
from ...memory.plan import MemoryPlan, MemorySpec, plan_memory

PROMPT_SAMPLE = 64  # dataset rows whose prompts size the planned passes


def numel(param) -> int:
    """Elements of a parameter, also when DeepSpeed ZeRO-3 has partitioned it (its `numel()` is then 0)."""
    return getattr(param, "ds_numel", None) or param.numel()


def trainable_count(model) -> int:
    return sum(numel(p) for p in model.parameters() if p.requires_grad)


def memory_spec(model, args: Any, *, batch_size: int, num_generations: int, release: str, beta: float, peft: bool,
                sharded: bool, replicated: bool, entropy_bonus: bool, router_aux: bool,
                num_reward_functions: int, prompt_tokens: int = 0, device=None) -> MemorySpec:
    """The spec of one learner process of this run (its caps as the config holds them); `replicated`: the learner
    placement runs per-source passes on the whole model (one process, DDP), so a group ready at once is one pass.
    `prompt_tokens`: the longest prompt the passes are planned for (`longest_prompt`); `device`: where the learner
    runs (on the CPU the framework line is measured: the resident set now, less the weights)."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    param_bytes = (trainable or params)[0].element_size()
    group_passes = args.batch_group_members and args.num_iterations == 1 and replicated
    passes = plan_passes(ModelShape.from_config(getattr(model, "config", None)), prompt_tokens=prompt_tokens,
                         completion_tokens=args.max_completion_length or 0, num_generations=num_generations,
                         group_passes=group_passes, max_pass_tokens=args.batch_group_max_tokens,
                         trl_rows=args.per_device_train_batch_size, dtype_bytes=param_bytes,
                         checkpointed=bool(args.gradient_checkpointing),
                         shared_prefix_from=args.shared_prefix_min_prompt_tokens if args.shared_prefix else None)
    return MemorySpec(
        total_params=sum(map(numel, params)), trainable_params=sum(map(numel, trainable)),
        param_bytes=param_bytes, optimizer=str(getattr(args.optim, "value", args.optim)),
        batch_size=batch_size, num_generations=num_generations, release=release,
        max_open_groups=args.max_open_groups, max_buffered_trajectories=args.max_buffered_trajectories, beta=beta,
        peft=peft, sharded=sharded, micro_batches=args.steps_per_generation, entropy_bonus=entropy_bonus,
        router_aux=router_aux, off_policy_mask=args.off_policy_mask_threshold is not None,
        objective_functions=num_reward_functions if args.multi_objective_aggregation == "normalize_then_sum" else 0,
        group_passes=group_passes, framework_bytes=framework_bytes(params, device), cpu_heap=on_cpu(device),
        activation_bytes=passes.streamed_bytes, trl_activation_bytes=passes.trl_bytes, pass_tokens=passes.tokens,
        prefix_bytes=passes.prefix_bytes)


def on_cpu(device) -> bool:
    return device is not None and str(device).split(":")[0] == "cpu"


def framework_bytes(params, device) -> int:
    """On a CPU learner: this process's resident set now, less its parameters' bytes (the framework, the
    tokenizer, the data: what is resident before training and is not the model); 0 elsewhere (not measured)."""
    if not on_cpu(device):
        return 0
    return max(0, current_resident_bytes() - sum(numel(p) * p.element_size() for p in params))


def longest_prompt(dataset, tokenizer, rows: int = PROMPT_SAMPLE) -> int:
    """Tokens of the longest prompt among the dataset's first `rows` (chat prompts through the tokenizer's chat
    template, as TRL renders them); 0 when the dataset has no such prompts (an environment's, an iterable one)."""
    if dataset is None or tokenizer is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return 0
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer
    longest = 0
    for index in range(min(rows, len(dataset))):
        prompt = dataset[index].get("prompt") if isinstance(dataset[index], dict) else None
        try:
            if isinstance(prompt, str):
                ids = tokenizer(prompt)["input_ids"]
            elif isinstance(prompt, list):
                ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            else:
                continue
        except Exception:  # noqa: BLE001 - a prompt the tokenizer cannot render sizes nothing; TRL reports it later
            continue
        longest = max(longest, len(ids))
    return longest


def is_replicated(accelerator) -> bool:
    """Neither DeepSpeed nor FSDP: the placement is `ReplicatedPlacement` (`trainers/placement`)."""
    return accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP)


def is_sharded(accelerator) -> bool:
    """ZeRO-3 or FSDP full shard: each rank gathers a replica of θ_k (docs/several-processes.md)."""
    if accelerator.distributed_type == DistributedType.FSDP:
        return True
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and getattr(plugin, "zero_stage", 0) == 3


def settle_memory(spec: MemorySpec, args: Any, device, log) -> tuple[MemoryPlan, Caps]:
    """Choose the caps from `args.memory_budget`, write them into `args`, log the plan (`log`: one call with the
    whole text), and refuse a run that cannot fit the memory free on `device` now."""
    if args.schedule == "sync":  # the learner runs after every reward is known: nothing to choose for it
        caps = Caps(spec.max_open_groups, spec.max_buffered_trajectories, spec.release,
                    "schedule='sync' holds no release buffer: caps as set")
    else:
        caps = choose_caps(spec, parse_budget(args.memory_budget))
    if caps.max_open_groups != args.max_open_groups:
        args.max_open_groups = caps.max_open_groups
    if caps.max_buffered_trajectories != args.max_buffered_trajectories:
        args.max_buffered_trajectories = caps.max_buffered_trajectories
    if caps.release != spec.release:
        args.release = caps.release
    plan = plan_memory(replace(spec, max_open_groups=caps.max_open_groups, release=caps.release,
                               max_buffered_trajectories=caps.max_buffered_trajectories), device=str(device))
    log(f"{plan.table()}\n  {caps.reason}")
    check_fits(plan, args.schedule, free_bytes(device))
    return plan, caps


def check_trainable(model, plan: MemoryPlan) -> None:
    """MemoryPlanError when the model's trainable parameters are not the planned ones."""
    now = trainable_count(model)
    if now != plan.spec.trainable_params:
        raise MemoryPlanError(
            f"the model has {now:,} trainable parameters, the memory plan was made for "
            f"{plan.spec.trainable_params:,}: its caps and buffers no longer fit the model. Add the PEFT adapter "
            "(peft_config) or freeze/unfreeze parameters before building the trainer")


def memory_metrics(plan: MemoryPlan, schedule: str) -> dict[str, float]:
    """This process's planned peak for `schedule` (a prediction, with the measured framework line) and its
    measured peak so far (`memory.available.peak_resident_bytes`), in MiB, logged each batch side by side."""
    return {"thundersync/memory_plan_mb": plan.total(schedule) / 2**20,
            "thundersync/peak_memory_mb": peak_resident_bytes(plan.device) / 2**20}
