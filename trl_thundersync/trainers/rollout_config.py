"""Rollout-engine fields shared by `ThunderSyncGRPOConfig` and `ThunderSyncGKDConfig`: which engine generates, the
rollout servers and how θ_{k+1} reaches them. One definition, one validation, the same defaults for both trainers.

`RolloutFields` is a dataclass mixin; a config calls `check_rollout_fields(allowed_engines)` from its
`__post_init__` (every `RolloutEngine`, or the subset it supports). `TRLVLLMServerFields` adds TRL's `use_vllm` /
`vllm_*` server fields (taken from `trl.GRPOConfig`, defaults and help included) to a config whose TRL parent does
not have them (GKD's).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from trl import GRPOConfig

from ..errors import ConfigurationError, UnsupportedOptionError
from ..rollout.vllm_api import check_base_url
from .config_checks import require_choice

RolloutEngine = Literal["auto", "local_process", "local_thread", "trl", "embedded_server", "vllm_server",
                        "managed_vllm"]
WeightPublisher = Literal["auto", "nccl", "reload", "lora", "http"]
WEIGHT_PUBLISHERS: tuple[WeightPublisher, ...] = get_args(WeightPublisher)
SERVER_ENGINES: tuple[RolloutEngine, ...] = ("embedded_server", "vllm_server", "managed_vllm")
VLLM_ENGINES: tuple[RolloutEngine, ...] = ("vllm_server", "managed_vllm")  # samples drawn by real vLLM


@dataclass(kw_only=True)  # keyword-only: positional arguments stay TRL's (output_dir first)
class RolloutFields:
    r"""
    Rollout-engine fields shared by both ThunderSync configs (docs/rollout-servers.md).

    Parameters:
        > Parameters that choose the engine

        rollout_engine (`str`, *optional*, defaults to `"auto"`):
            Who samples: `"managed_vllm"`, `"embedded_server"`, `"vllm_server"`, `"local_process"`,
            `"local_thread"` or `"trl"`; `"auto"` picks one and logs why.
        rollout_vllm (`str`, *optional*):
            `managed_vllm`: the vLLM installation its servers start from.
        rollout_vllm_kv_cache_gib (`float`, *optional*, defaults to `1.0`):
            `managed_vllm` on a CPU build: each server's KV cache in GiB.
        rollout_vllm_args (`list[str]`, *optional*):
            `managed_vllm`: more `vllm serve` arguments.
        rollout_num_servers (`int`, *optional*, defaults to `1`):
            Servers to start when no URL is given.

        > Parameters that control the servers and weight publication

        vllm_server_base_urls (`list[str]`, *optional*):
            Several rollout server URLs (replicas).
        vllm_weight_publisher (`str`, *optional*, defaults to `"auto"`):
            How θ_{k+1} reaches the servers: `"nccl"`, `"reload"`, `"lora"`, `"http"` or `"auto"`.
        vllm_publish_dir (`str`, *optional*):
            A folder the servers can read, for published adapters and weights.
        rollout_request_timeout (`float`, *optional*, defaults to `600.0`):
            Seconds one generation request may take.
        rollout_restart_timeout (`float`, *optional*, defaults to `300.0`):
            Seconds a failed server may take to come back.
        rollout_retries (`int`, *optional*, defaults to `3`):
            Times one request is resent after its server came back.
        rollout_server_restarts (`int`, *optional*, defaults to `3`):
            Times a dead embedded server is restarted.
        rollout_max_in_flight (`int`, *optional*):
            Trajectories decoded at once (embedded engines) or requests in flight per vLLM server.

        > Parameters that control CPU threads

        rollout_num_threads (`int`, *optional*, defaults to `1`):
            Threads of each embedded rollout worker or server, or of each managed vLLM server on a CPU.
        learner_num_threads (`int`, *optional*):
            torch threads of the learner on a CPU.
    """

    rollout_engine: RolloutEngine = field(
        default="auto",
        metadata={
            "help": "Who samples: 'managed_vllm' (vllm serve processes started for the run), 'embedded_server' (the "
            "package's HTTP servers), 'vllm_server' (servers you started, use_vllm=True), 'local_process' / "
            "'local_thread' (in-process, no HTTP) or 'trl' (GRPO only: TRL's own generation). 'auto': vllm_server "
            "with use_vllm, trl with rollout_func, managed_vllm when a usable vLLM is found, else embedded_server."
        },
    )
    vllm_server_base_urls: list[str] | None = field(
        default=None,
        metadata={
            "help": "Base URLs of several rollout servers (data-parallel replicas), e.g. ['http://10.0.0.5:8000', "
            "'http://10.0.0.6:8000']. Overrides vllm_server_base_url / host / port. Each trajectory stays on one "
            "replica (prefix cache); new trajectories go to the least-loaded one."
        },
    )
    vllm_weight_publisher: WeightPublisher = field(
        default="auto",
        metadata={
            "help": "How θ_{k+1} reaches the servers: 'nccl' (full weights, GPU), 'reload' (a checkpoint folder vLLM "
            "reloads; CPU or GPU), 'lora' (versioned adapters), 'http' (embedded servers). 'auto' picks one and "
            "logs why."
        },
    )
    vllm_publish_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder the rollout servers read published adapters and weights from, mounted at the same path "
            "on the trainer and the servers (needed for servers on other hosts). None: the trainer's temp folder."
        },
    )
    rollout_num_servers: int = field(
        default=1, metadata={"help": "embedded_server without URLs, and managed_vllm: how many servers (replicas) "
                             "to start."}
    )
    rollout_vllm: str | None = field(
        default=None,
        metadata={"help": "managed_vllm: the vLLM installation its servers start from (a venv folder, its Python, or "
                  "a `vllm` command). None: $THUNDERSYNC_VLLM_PYTHON, else a .venv-vllm found from the working "
                  "directory up."},
    )
    rollout_vllm_kv_cache_gib: float = field(
        default=1.0,
        metadata={"help": "managed_vllm on a CPU build of vLLM: each server's KV cache in GiB. On a GPU build "
                  "vllm_gpu_memory_utilization sets the share of GPU memory instead."},
    )
    rollout_vllm_args: list[str] | None = field(
        default=None,
        metadata={"help": "managed_vllm: more `vllm serve` arguments, appended to the ones the trainer sets "
                  "(e.g. ['--max-num-seqs', '64'])."},
    )
    rollout_request_timeout: float = field(
        default=600.0, metadata={"help": "Seconds one generation request (one turn) may take on a server."}
    )
    rollout_restart_timeout: float = field(
        default=300.0,
        metadata={"help": "Seconds a failed server may take to come back before the batch fails; its requests are "
                  "then resent with the same seeds."},
    )
    rollout_retries: int = field(
        default=3, metadata={"help": "Times one request is sent again after its server failed and came back."}
    )
    rollout_server_restarts: int = field(
        default=3,
        metadata={"help": "Times an embedded or managed server that died is restarted and given the current "
                  "weights, its requests resent with their seeds. 0: the batch fails at once."},
    )
    rollout_max_in_flight: int | None = field(
        default=None,
        metadata={"help": "Trajectories an embedded engine decodes at once, or requests in flight per vLLM server. "
                  "None: 16 for embedded engines; each vLLM server's --max-num-seqs."},
    )
    rollout_num_threads: int = field(
        default=1, metadata={"help": "torch threads of the embedded rollout worker process (or of each server)."}
    )
    learner_num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op threads of the learner on CPU. None: the cores the embedded rollout worker leaves "
            "free (at least 1) when it runs in a process, else torch's default."
        },
    )

    def settle_rollout_engine(self, model_config: Any, *, uses_rollout_func: bool = False):
        """Decide what `rollout_engine` stands for with this model (`trainers.rollout_choice`), once per trainer,
        before it builds anything; 'auto' logs its choice. Returns the `RolloutChoice`."""
        from .rollout_choice import choose_rollout_engine, log_choice

        choice = choose_rollout_engine(self, model_config, uses_rollout_func=uses_rollout_func)
        self.__dict__["_rollout_choice"] = choice  # not a dataclass field: never serialized with the config
        if self.rollout_engine == "auto":
            log_choice(choice)
        return choice

    @property
    def rollout_choice(self):
        """The `RolloutChoice` a trainer settled (`settle_rollout_engine`), or None before one did."""
        return self.__dict__.get("_rollout_choice")

    def resolved_rollout_engine(self, uses_rollout_func: bool = False) -> str:
        """The engine `rollout_engine='auto'` stands for: the settled choice; before a trainer settled it, what can
        be told without the model ('embedded_server' standing for whichever server engine it will pick)."""
        if self.rollout_engine != "auto":
            return self.rollout_engine
        if self.rollout_choice is not None:
            return self.rollout_choice.engine
        if self.use_vllm:
            return "vllm_server"
        return "trl" if uses_rollout_func else "embedded_server"

    def samples_from_vllm(self) -> bool:
        """Whether real vLLM draws the samples (servers the user started, or managed ones): TRL's `use_vllm`
        semantics then apply — generation_kwargs forwarded, the importance-sampling correction, sampling/* metrics."""
        return bool(self.use_vllm) or self.resolved_rollout_engine(False) == "managed_vllm"

    def server_urls(self) -> list[str] | None:
        """Rollout server URLs: `vllm_server_base_urls`, else (use_vllm) TRL's single-server fields; None: start
        servers for the run (embedded or managed vLLM)."""
        if self.vllm_server_base_urls:
            return list(self.vllm_server_base_urls)
        if not self.use_vllm:
            return None
        if self.vllm_server_base_url:
            return [self.vllm_server_base_url]
        return [f"http://{self.vllm_server_host}:{self.vllm_server_port}"]

    def check_rollout_fields(self, engines: tuple[RolloutEngine, ...]) -> None:
        """Validate the rollout fields; `engines` are the `rollout_engine` values this config accepts."""
        if self.use_vllm and self.vllm_mode != "server":
            raise UnsupportedOptionError(
                f"{type(self).__name__}: vllm_mode={self.vllm_mode!r} is not supported: ThunderSync generates on "
                "rollout servers in other processes while the learner runs; use vllm_mode='server' (or "
                "use_vllm=False for the embedded engine)")
        require_choice(self, "rollout_engine", RolloutEngine, engines)
        if (self.rollout_max_in_flight is not None and self.rollout_max_in_flight < 1) or self.rollout_num_threads < 1:
            raise ConfigurationError(f"rollout_max_in_flight={self.rollout_max_in_flight} and rollout_num_threads="
                                     f"{self.rollout_num_threads} must be ≥ 1")
        if self.learner_num_threads is not None and self.learner_num_threads < 1:
            raise ConfigurationError(f"learner_num_threads={self.learner_num_threads} must be ≥ 1 (or None)")
        require_choice(self, "vllm_weight_publisher", WeightPublisher)
        self._check_publisher_servers()
        self._check_publish_dir()
        if not self.rollout_vllm_kv_cache_gib > 0:
            raise ConfigurationError(f"rollout_vllm_kv_cache_gib={self.rollout_vllm_kv_cache_gib} must be > 0")
        if self.rollout_vllm_args is not None and not all(isinstance(a, str) for a in self.rollout_vllm_args):
            raise ConfigurationError(f"rollout_vllm_args={self.rollout_vllm_args!r} must be a list of strings")
        if self.rollout_num_servers < 1 or self.rollout_retries < 0 or self.rollout_server_restarts < 0:
            raise ConfigurationError(f"rollout_num_servers={self.rollout_num_servers} must be ≥ 1, "
                                     f"rollout_retries={self.rollout_retries} ≥ 0 and "
                                     f"rollout_server_restarts={self.rollout_server_restarts} ≥ 0")
        if self.rollout_request_timeout <= 0 or self.rollout_restart_timeout <= 0:
            raise ConfigurationError(f"rollout_request_timeout={self.rollout_request_timeout} and "
                                     f"rollout_restart_timeout={self.rollout_restart_timeout} must be > 0")
        self._check_server_choice()

    def _check_server_choice(self) -> None:
        urls = self.vllm_server_base_urls
        if urls is not None and (not urls or len(set(urls)) != len(urls)):
            raise ConfigurationError(f"vllm_server_base_urls={urls} must name at least one server, each once")
        self._check_server_addresses()
        engine = self.rollout_engine
        if self.use_vllm and engine not in ("auto", "vllm_server"):
            raise ConfigurationError(f"use_vllm=True generates on vLLM servers the user started, but rollout_engine="
                                     f"{engine!r}; leave rollout_engine='auto' (or set use_vllm=False"
                                     + (", which managed_vllm needs: it starts its own servers)" if
                                        engine == "managed_vllm" else ")"))
        if engine == "vllm_server" and not self.use_vllm:
            raise ConfigurationError("rollout_engine='vllm_server' needs use_vllm=True and vllm_mode='server' (TRL's "
                                     "fields); for the embedded server use rollout_engine='embedded_server'")
        if urls and engine == "managed_vllm":
            raise ConfigurationError("vllm_server_base_urls is set but rollout_engine='managed_vllm' starts its own "
                                     "servers; for servers at given URLs set use_vllm=True (vLLM) or "
                                     "rollout_engine='embedded_server'")
        if urls and engine not in ("auto", *SERVER_ENGINES):
            raise ConfigurationError(f"vllm_server_base_urls is set but rollout_engine={engine!r} does not use "
                                     "servers; set rollout_engine='embedded_server' or use_vllm=True")
        if urls and engine == "auto" and not self.use_vllm:
            raise ConfigurationError("vllm_server_base_urls is set: also set use_vllm=True, vllm_mode='server' for "
                                     "vLLM servers, or rollout_engine='embedded_server' for embedded ones")


    def resolved_weight_publisher(self, device: Any = None) -> str:
        """The publisher `vllm_weight_publisher` stands for with the learner on `device` (None: CUDA when this
        config can use it); 'auto' as `rollout.publisher_choice.auto_publisher` decides."""
        if self.vllm_weight_publisher != "auto":
            return self.vllm_weight_publisher
        from ..rollout.publisher_choice import auto_publisher

        if device is None:
            device = "cpu" if getattr(self, "use_cpu", False) or not torch.cuda.is_available() else "cuda"
        if self.resolved_rollout_engine(False) == "managed_vllm":
            from ..rollout.vllm_managed import managed_publisher

            return managed_publisher(self.vllm_weight_publisher, directory=self.vllm_publish_dir is not None)[0]
        return auto_publisher(vllm=self.samples_from_vllm(), device=device,
                              directory=self.vllm_publish_dir is not None)[0]

    def _check_publisher_servers(self) -> None:
        """A publisher the configured servers cannot load from is refused here, naming the field."""
        publisher, managed = self.vllm_weight_publisher, self.rollout_engine == "managed_vllm"
        if publisher == "http" and (self.use_vllm or managed):
            raise ConfigurationError(
                "vllm_weight_publisher='http' loads full weights through the embedded server's "
                "/thundersync/update_weights, which vLLM servers (use_vllm=True) do not have; use 'reload' (a "
                "checkpoint folder loaded through vLLM's dev-mode /collective_rpc, CPU or GPU), 'nccl' (GPU), "
                "'lora' (adapters) or 'auto'")
        if publisher == "reload" and not (self.use_vllm or self.rollout_engine in ("auto", "managed_vllm")):
            raise ConfigurationError("vllm_weight_publisher='reload' loads checkpoints through vLLM's "
                                     f"/collective_rpc; rollout_engine={self.rollout_engine!r} has no vLLM servers "
                                     "(embedded servers load 'http'); use 'auto', or rollout_engine='managed_vllm' "
                                     "or use_vllm=True")

    def _check_publish_dir(self) -> None:
        """A publish folder that NCCL would ignore, or that is not a writable folder, is refused naming the field."""
        folder = self.vllm_publish_dir
        if folder is None:
            return
        if self.vllm_weight_publisher == "nccl":
            raise ConfigurationError(f"vllm_publish_dir={folder!r} is set, but vllm_weight_publisher='nccl' sends "
                                     "the weights over NCCL and writes no files; set vllm_weight_publisher='reload' "
                                     "(full-weight checkpoints in that folder), 'lora' (adapters) or 'auto'")
        if self.rollout_engine in ("local_process", "local_thread", "trl"):
            raise ConfigurationError(f"vllm_publish_dir={folder!r} is set, but rollout_engine="
                                     f"{self.rollout_engine!r} publishes to no server")
        path = Path(folder)
        if path.exists() and not path.is_dir():
            raise ConfigurationError(f"vllm_publish_dir={folder!r} is not a folder")
        if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
            raise ConfigurationError(f"vllm_publish_dir={folder!r} is not writable by this process")

    def _check_server_addresses(self) -> None:
        """A malformed address is refused here, naming its field, instead of being polled for vllm_server_timeout."""
        for i, url in enumerate(self.vllm_server_base_urls or ()):
            check_base_url(url, f"vllm_server_base_urls[{i}]")
        if self.vllm_server_base_url is not None:
            check_base_url(self.vllm_server_base_url, "vllm_server_base_url")
        if not self.use_vllm or self.vllm_server_base_urls or self.vllm_server_base_url:
            return  # host and port are not used
        host, port = self.vllm_server_host, self.vllm_server_port
        if not isinstance(host, str) or not host or any(c in host for c in "/:@?# \t"):
            raise ConfigurationError(f"vllm_server_host={host!r} must be a host name or IPv4 address like "
                                     "'10.0.0.5' (no scheme, port or path; for anything else set "
                                     "vllm_server_base_url)")
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ConfigurationError(f"vllm_server_port={port!r} must be a TCP port in 1..65535")
        check_base_url(f"http://{host}:{port}", "vllm_server_host")


def _grpo_field(name: str):
    """`trl.GRPOConfig`'s field `name` (default and help), for a config whose TRL parent lacks it."""
    (source,) = [f for f in dataclasses.fields(GRPOConfig) if f.name == name]
    return field(default=source.default, metadata=dict(source.metadata))


@dataclass(kw_only=True)
class TRLVLLMServerFields:
    use_vllm: bool = _grpo_field("use_vllm")
    vllm_mode: str = _grpo_field("vllm_mode")
    vllm_server_base_url: str | None = _grpo_field("vllm_server_base_url")
    vllm_server_host: str = _grpo_field("vllm_server_host")
    vllm_server_port: int = _grpo_field("vllm_server_port")
    vllm_server_timeout: float = _grpo_field("vllm_server_timeout")
    vllm_group_port: int = _grpo_field("vllm_group_port")
    vllm_gpu_memory_utilization: float = _grpo_field("vllm_gpu_memory_utilization")  # managed_vllm on a GPU
    vllm_max_model_length: int | None = _grpo_field("vllm_max_model_length")  # managed_vllm's --max-model-len
