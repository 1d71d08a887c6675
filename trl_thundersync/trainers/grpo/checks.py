"""What `ThunderSyncGRPOTrainer` refuses or converts before it streams: its `args`, the generation fields its
engines do not forward, and the distributed setups its barrier cannot write into."""

from __future__ import annotations

from typing import Any

from trl import GRPOConfig
from trl.trainer.utils import get_config_model_id

from ...errors import ConfigurationError, UnsupportedOptionError
from ...rollout.request_fields import request_fields
from ...streaming.loss_types import loss_type
from ..placement import check_engine
from .config import ThunderSyncGRPOConfig


def thundersync_args(model, args) -> ThunderSyncGRPOConfig:
    """`args` with TRL's meaning: None is TRL's default config named after the model, a plain `trl.GRPOConfig` is
    converted (`ThunderSyncGRPOConfig.from_trl`); anything else is refused."""
    if args is None:
        model_name = model if isinstance(model, str) else get_config_model_id(model.config)
        return ThunderSyncGRPOConfig(output_dir=f"{model_name.split('/')[-1]}-GRPO")
    if isinstance(args, ThunderSyncGRPOConfig):
        return args
    if isinstance(args, GRPOConfig):
        return ThunderSyncGRPOConfig.from_trl(args)
    raise UnsupportedOptionError(
        f"args is a {type(args).__name__}; pass a ThunderSyncGRPOConfig or a trl.GRPOConfig so unsupported options "
        "are checked")


def refuse_dropped_generation_fields(args: Any, uses_trl_generation: bool) -> None:
    """`generation_kwargs` and `vllm_structured_outputs_regex`: with vLLM servers (use_vllm=True) they go into every
    request as TRL's server client sends them, checked here so a key vLLM would ignore or the engine must set is
    refused by name at construction (`rollout.request_fields`); the embedded engines implement none of them.
    `uses_trl_generation`: TRL's own generation samples (rollout_func, rollout_engine='trl'), nothing to check."""
    if uses_trl_generation:
        return
    engine = args.resolved_rollout_engine(False)
    if args.samples_from_vllm():
        request_fields(args.generation_kwargs, args.vllm_structured_outputs_regex)
        streams = loss_type(args.loss_type).streams_vllm_correction
        if args.vllm_importance_sampling_correction and not streams:  # 'auto' chose vLLM
            raise UnsupportedOptionError(
                f"vllm_importance_sampling_correction=True with loss_type={args.loss_type!r} and rollout_engine="
                f"{engine!r}: TRL folds the ratio into the loss's own weights (VESPO's gamma weights), which is not "
                "streamed; set it to False or pick another loss_type")
        return
    for name in ("generation_kwargs", "vllm_structured_outputs_regex"):
        value = getattr(args, name)
        if value:
            raise UnsupportedOptionError(
                f"{name}={value!r}: the embedded rollout engine (rollout_engine={engine!r}) samples with "
                "temperature, top_p, top_k, min_p and repetition_penalty only, so the samples would not be what TRL "
                "would draw; leave it unset, generate on vLLM servers (use_vllm=True, which forward it), or with "
                "TRL's own generation (rollout_engine='trl')")


def check_distributed(accelerator: Any, args: Any, num_generations: int) -> None:
    """Refuse sharded setups and, with several processes, groups split across processes."""
    check_engine(accelerator, args)
    local_rows = args.per_device_train_batch_size * args.steps_per_generation
    if accelerator.num_processes > 1 and local_rows % num_generations:
        raise ConfigurationError(
            f"per_device_train_batch_size × steps_per_generation = {local_rows} is not a multiple of "
            f"num_generations={num_generations}: with {accelerator.num_processes} processes every "
            "GRPO group must live on one process so it can close there; change per_device_train_batch_size"
        )
