"""The turn generator both ThunderSync trainers sample with, built from the `RolloutFields` of their config: the
embedded engine in a worker process or thread, embedded HTTP servers started for the run, or servers at given URLs
(vLLM or embedded), driven by `VLLMServerEngine` with publication and acknowledgement.

    generator = build_turn_generator(RolloutTarget(policy, tokenizer, device, processes, version), args, sampling,
                                     on_metric=lambda name, value: ...)

A trainer handed a generator (`trainer.use_turn_generator(g)`, any `rollout.engine.TurnGenerator`) uses that one
instead. With tools or environments both trainers wrap the generator in the agent loop with
`rollout.agent_setup.make_agent_engine` (`rollout.agent_setup.capped_agent_limits` gives that loop a context budget
the model and the servers can hold); without, `as_rollout_engine` gives it `start_batch`/`results`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UnsupportedOptionError
from ..rollout.engine import TurnGenerator
from ..rollout.request_fields import request_fields
from ..types import SamplingParams
from .rollout_config import SERVER_ENGINES, RolloutFields

logger = logging.getLogger(__name__)

MetricSink = Callable[[str, float], None]  # (metric name, value) appended to the trainer's train metrics
EMBEDDED_MAX_IN_FLIGHT = 16  # rollout_max_in_flight=None for the embedded engine and embedded servers


@dataclass(frozen=True)
class RolloutTarget:
    """What the generator samples from and where the learner runs."""

    policy: Any  # the unwrapped policy module at `policy_version` (LoRA: the PEFT model)
    tokenizer: Any  # the policy's tokenizer (servers load it; the client decodes nothing with it)
    device: torch.device  # the learner's device; on CPU the learner's thread count is set here
    num_processes: int  # trainer processes (accelerate's `num_processes`), each with its own generator
    policy_version: int  # the version `policy` holds now
    process_index: int = 0  # this process's rank (accelerate's `process_index`); rank 0 publishes to servers


def check_turn_generator(uses_trl_generation: bool, *, built: bool) -> None:
    """`use_turn_generator`: a generator replaces ThunderSync's own rollout engine, so it comes before that one is
    built; TRL's batch generation (rollout_func, rollout_engine='trl') has no place for one."""
    if uses_trl_generation:
        raise UnsupportedOptionError(
            "use_turn_generator: a turn generator samples in place of ThunderSync's rollout engine; it cannot be "
            "combined with rollout_func or rollout_engine='trl', which generate with TRL's own batch generation")
    if built:
        raise UnsupportedOptionError(
            "use_turn_generator: the trainer already built its rollout engine (rollout_engine, or a training step); "
            "hand the generator over right after constructing the trainer")


def build_turn_generator(target: RolloutTarget, args: RolloutFields, sampling: SamplingParams, *,
                         on_metric: MetricSink) -> TurnGenerator:
    """The generator `args.resolved_rollout_engine()` names (never 'trl': that one is the GRPO trainer's own)."""
    kind = args.resolved_rollout_engine(False)
    if kind in SERVER_ENGINES:
        return _server_engine(target, args, sampling, on_metric)
    from ..rollout.local import LocalProcessEngine

    mode = "thread" if kind == "local_thread" else "process"
    set_learner_threads(target, args, mode, args.rollout_num_threads, on_metric)
    in_flight = args.rollout_max_in_flight or EMBEDDED_MAX_IN_FLIGHT
    return LocalProcessEngine(target.policy, sampling, max_in_flight=in_flight,
                              mode=mode, num_threads=args.rollout_num_threads, policy_version=target.policy_version)


def _server_engine(target: RolloutTarget, a: RolloutFields, sampling: SamplingParams,
                   on_metric: MetricSink) -> TurnGenerator:
    """`VLLMServerEngine` over the configured servers, or over embedded servers started for this run (by rank 0,
    with several processes: every rank gets its own engine over them, and only rank 0 publishes)."""
    from ..rollout.publish_role import distributed_role
    from ..rollout.vllm_client import VLLMServerEngine
    from ..rollout.vllm_shapes import check_servable
    from ..serve.launcher import ServerOptions, start_embedded_engine

    urls = a.server_urls()
    replicas = len(urls) if urls else a.rollout_num_servers
    managed = a.resolved_rollout_engine(False) == "managed_vllm"
    embedded = urls is None and not managed
    per_server = a.rollout_max_in_flight or (EMBEDDED_MAX_IN_FLIGHT if embedded else None)  # None: the servers'
    common = dict(publisher=_publisher(a, target.device), max_concurrency=per_server and per_server * replicas,
                  request_timeout=a.rollout_request_timeout, retries=a.rollout_retries,
                  restart_timeout=a.rollout_restart_timeout, policy_version=target.policy_version,
                  role=distributed_role(target.process_index, target.num_processes))
    supervisor = None  # managed vLLM servers started by rank 0
    if managed:
        set_learner_threads(target, a, "process", a.rollout_num_threads * replicas, on_metric)
        supervisor, urls = _start_managed_servers(target, a, common["role"], on_metric)
        common["publisher"] = _managed_publisher(a, target.device)
    elif embedded:  # embedded servers started from the policy as it is now
        set_learner_threads(target, a, "process", a.rollout_num_threads * replicas, on_metric)
        options = ServerOptions(max_in_flight=per_server, num_threads=a.rollout_num_threads,
                                startup_timeout=a.vllm_server_timeout)
        return start_embedded_engine(target.policy, target.tokenizer, sampling, replicas=replicas, options=options,
                                     startup_timeout=a.vllm_server_timeout, max_restarts=a.rollout_server_restarts,
                                     **common)  # LoRA: adapter published
    nccl = {"device": target.device, "group_port": a.vllm_group_port,
            "connection_timeout": a.vllm_server_timeout}  # TRL's weight-transfer client, as TRL configures it
    vllm = a.samples_from_vllm()  # TRL's generation fields reach real vLLM only
    fields = request_fields(getattr(a, "generation_kwargs", None),
                            getattr(a, "vllm_structured_outputs_regex", None)) if vllm else None
    correction = vllm and bool(getattr(a, "vllm_importance_sampling_correction", False))
    try:
        engine = VLLMServerEngine(urls, target.tokenizer, sampling, startup_timeout=a.vllm_server_timeout,
                                  nccl_options=nccl, publish_first=True,  # publish_first: a server may outlive a run
                                  request_fields=fields, importance_sampling=correction, supervisor=supervisor,
                                  max_restarts=a.rollout_server_restarts, **common)
    except BaseException:
        if supervisor is not None:
            supervisor.close()
        raise
    try:  # servers started elsewhere hold their own weights: load θ at the trainer's version first (rank 0 pushes)
        if vllm:  # a CPU vLLM loads a model it cannot serve, then dies on the first request: refuse it here
            check_servable(urls, getattr(target.policy, "config", None), timeout=a.rollout_request_timeout)
        seconds = engine.publish(target.policy, target.policy_version)
    except BaseException:
        engine.close()
        raise
    on_metric("thundersync/publish_seconds", seconds)
    return engine


def _start_managed_servers(target: RolloutTarget, a: RolloutFields, role: Any,
                           on_metric: MetricSink) -> tuple[Any, list[str]]:
    """`rollout_num_servers` real `vllm serve` processes started by rank 0 from the policy as it is now
    (`rollout.vllm_managed`); every rank gets their URLs. Returns (the supervisor on rank 0 else None, URLs)."""
    from ..rollout.publish_role import run_on_main
    from ..rollout.vllm_launch import find_vllm
    from ..rollout.vllm_managed import ManagedVLLMOptions, ManagedVLLMServers, managed_publisher

    choice = a.rollout_choice
    install = choice.install if choice is not None and choice.install is not None else find_vllm(a.rollout_vllm)
    if install is None:
        from ..errors import ConfigurationError

        raise ConfigurationError("rollout_engine='managed_vllm' found no vLLM installation: run "
                                 "scripts/setup_vllm.sh or set rollout_vllm")
    lora = managed_publisher(a.vllm_weight_publisher)[0] == "lora"
    options = ManagedVLLMOptions(
        install, kv_cache_gib=a.rollout_vllm_kv_cache_gib, gpu_memory_utilization=a.vllm_gpu_memory_utilization,
        max_model_len=a.vllm_max_model_length or _context_length(target.policy),
        lora_rank=_lora_rank(target.policy) if lora else None,
        launcher="trl" if a.vllm_weight_publisher == "nccl" else "vllm",
        extra_args=tuple(a.rollout_vllm_args or ()), startup_timeout=a.vllm_server_timeout,
        num_threads=a.rollout_num_threads)
    servers = None

    def start() -> tuple[str, ...]:
        nonlocal servers
        servers = ManagedVLLMServers.start(target.policy, target.tokenizer, options, replicas=a.rollout_num_servers,
                                           without_adapters=lora)
        return tuple(servers.urls)

    urls = list(run_on_main(role, f"starting {a.rollout_num_servers} managed vLLM server(s)", start))
    if servers is not None:
        on_metric("thundersync/rollout_server_start_seconds", servers.start_seconds)
    return servers, urls


def _context_length(policy: Any) -> int | None:
    """The policy's own context length (`max_position_embeddings`), which the servers then serve; None: unknown."""
    config = getattr(policy, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    length = getattr(text, "max_position_embeddings", None)
    return length if isinstance(length, int) and length > 0 else None


def _lora_rank(policy: Any) -> int:
    """The rank of the PEFT policy's active adapter (the servers' --max-lora-rank must hold it)."""
    configs = getattr(policy, "peft_config", None) or {}
    config = configs.get(getattr(policy, "active_adapter", "default")) or next(iter(configs.values()), None)
    if config is None or not isinstance(getattr(config, "r", None), int):
        from ..errors import ConfigurationError

        raise ConfigurationError("vllm_weight_publisher='lora' needs a PEFT LoRA policy (peft_config=LoraConfig(...))")
    return config.r


def _managed_publisher(a: RolloutFields, device: torch.device) -> Any:
    """The publisher of managed servers (`vllm_managed.managed_publisher`; 'auto' → 'reload'), logged."""
    from ..rollout.publisher_choice import build_publisher
    from ..rollout.vllm_managed import managed_publisher

    name, reason = managed_publisher(a.vllm_weight_publisher, directory=a.vllm_publish_dir is not None)
    if a.vllm_weight_publisher == "auto":
        logger.warning("vllm_weight_publisher='auto' chose %r: %s", name, reason)
    if name == "nccl":
        return name  # the engine builds TRL's NCCL client with its nccl_options
    return build_publisher(name, directory=a.vllm_publish_dir, timeout=a.rollout_request_timeout)


def _publisher(a: RolloutFields, device: torch.device) -> Any:
    """`vllm_weight_publisher`, or with `vllm_publish_dir` the publisher writing there (config-checked: not NCCL);
    'auto' is resolved by the engine (`publisher_choice.make_publisher`, from the servers it finds and `device`)."""
    if a.vllm_publish_dir is None:
        return a.vllm_weight_publisher
    from ..rollout.publisher_choice import build_publisher

    name = a.resolved_weight_publisher(device)
    if a.vllm_weight_publisher == "auto":
        logger.info("vllm_weight_publisher='auto' chose %r: vllm_publish_dir is set", name)
    return build_publisher(name, directory=a.vllm_publish_dir, timeout=a.rollout_request_timeout)


def set_learner_threads(target: RolloutTarget, args: RolloutFields, engine_mode: str, rollout_threads: int,
                        on_metric: MetricSink) -> None:
    """On CPU, leave the rollout worker's cores to it: oversubscribed OpenMP threads slow the learner by ~2× here."""
    if target.device.type != "cpu":
        return
    threads = args.learner_num_threads
    if threads is None and engine_mode == "process":
        cores = max(1, (os.cpu_count() or 1) // target.num_processes)
        threads = max(1, cores - rollout_threads)
    if threads is not None:
        torch.set_num_threads(threads)
        on_metric("thundersync/learner_threads", float(threads))
