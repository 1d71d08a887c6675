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
    rollout_engine: RolloutEngine = field(
        default="auto",
        metadata={
            "help": "'local_process': the embedded engine in a worker process, no HTTP; 'local_thread': the same "
            "engine in a thread (fights the learner for the GIL; for measurements); 'embedded_server': "
            "`rollout_num_servers` embedded HTTP servers (python -m trl_thundersync.serve) started for the run, or "
            "the ones at `vllm_server_base_urls`, driven by the vLLM client; 'vllm_server': vLLM servers "
            "the user started (use_vllm=True, vllm_mode='server'); 'managed_vllm': `rollout_num_servers` real "
            "`vllm serve` processes started for the run from the vLLM installation `rollout_vllm` and stopped with "
            "it, with vLLM's sampling semantics (as use_vllm=True: generation_kwargs, the importance-sampling "
            "correction); 'trl' (GRPO only): TRL's own batch generation (used automatically for rollout_func); "
            "'auto' picks 'vllm_server' with use_vllm=True, else 'trl' for rollout_func, else 'managed_vllm' when a "
            "vLLM installation is found that can serve the model, else 'embedded_server' (the production client "
            "code over HTTP, servers started for the run); the choice and its reason are logged."
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
            "help": "How θ_{k+1} reaches the servers after each optimizer step: 'nccl' (TRL's weight-transfer "
            "client, full weights, vLLM, GPU), 'reload' (full weights written as a checkpoint folder that vLLM "
            "reloads through its dev-mode /collective_rpc, then confirmed by /weight_info; CPU or GPU, no NCCL; "
            "needs VLLM_SERVER_DEV_MODE=1 and vLLM >= 0.32), 'lora' (the adapter hot-loaded as "
            "`policy-<run id>-v{k}`; needs a PEFT policy and servers started with --enable-lora), 'http' (a "
            "safetensors file, embedded servers only); 'auto': 'http' for embedded servers; for vLLM 'reload' when "
            "vllm_publish_dir is set, else 'nccl' where it can work (a CUDA learner with vLLM and TRL's client "
            "installed), else 'reload'. The choice is logged."
        },
    )
    vllm_publish_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder the rollout servers can read, where the published artifacts are written instead of the "
            "trainer's temp folder: the LoRA adapters (vllm_weight_publisher='lora'; vLLM opens `lora_path` on its "
            "own filesystem), the checkpoint folders of 'reload' and the full-weight files of 'http'. Needed when a "
            "server runs on another host: a "
            "shared filesystem mounted at the same path on both machines, readable by the server's user. Each run "
            "writes into its own subfolder, removed when the run ends. None: the trainer's temp folder (servers on "
            "this machine). Not used by 'nccl'."
        },
    )
    rollout_num_servers: int = field(
        default=1, metadata={"help": "embedded_server without URLs, and managed_vllm: how many servers (replicas) "
                             "to start."}
    )
    rollout_vllm: str | None = field(
        default=None,
        metadata={"help": "managed_vllm: the vLLM installation its servers start from: a venv folder, its Python "
                  "interpreter, or a `vllm` command. None: $THUNDERSYNC_VLLM_PYTHON, else the .venv-vllm that "
                  "scripts/setup_vllm.sh makes, looked for in the working directory and its parents "
                  "(THUNDERSYNC_VLLM=0 turns that search off)."},
    )
    rollout_vllm_kv_cache_gib: float = field(
        default=1.0,
        metadata={"help": "managed_vllm on a CPU build of vLLM: GiB of memory each server takes for its KV cache "
                  "(--kv-cache-memory-bytes; without a bound vLLM reserves most of the RAM). On a GPU build "
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
        metadata={"help": "Seconds a failed server may take to come back before the batch fails (its requests are "
                  "then sent again with the same seeds). Servers at given URLs are waited for; an embedded server "
                  "whose process died is restarted at once (rollout_server_restarts), and this bounds its wait for "
                  "/health after the restart."},
    )
    rollout_retries: int = field(
        default=3, metadata={"help": "Times one request is sent again after its server failed and came back."}
    )
    rollout_server_restarts: int = field(
        default=3,
        metadata={"help": "Embedded servers started by the trainer: times one whose process died is restarted "
                  "(from the run's initial weights, then re-published the current policy version; its requests are "
                  "sent again with the same seeds, so the samples are the same). 0: the batch fails at once with "
                  "the server's exit code and log tail. Servers at given URLs are never restarted by the trainer: "
                  "it waits up to rollout_restart_timeout for them to come back."},
    )
    rollout_max_in_flight: int | None = field(
        default=None,
        metadata={"help": "Trajectories the embedded engine (or each embedded server) decodes concurrently, or "
                  "requests kept in flight on each vLLM server. None: 16 for the embedded ones; for vLLM servers "
                  "each server's --max-num-seqs (GET /server_info, dev mode), else 256 (vLLM's default)."},
    )
    rollout_num_threads: int = field(
        default=1, metadata={"help": "torch threads of the embedded rollout worker process (or of each server)."}
    )
    learner_num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op threads of the learner on CPU. None: when the embedded engine runs in a worker "
            "process, the cores it leaves free (cpu_count − rollout_num_threads, at least 1), so learner and "
            "rollout threads do not oversubscribe the CPU; otherwise torch's default."
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
