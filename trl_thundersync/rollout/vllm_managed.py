"""Managed vLLM rollout servers (`rollout_engine='managed_vllm'`): real `vllm serve` processes that the trainer
starts from the policy in memory and stops when it ends, driven by the same `VLLMServerEngine`, publishers and
version checks as servers the user started.

    servers = ManagedVLLMServers.start(policy, tokenizer, options, replicas=2)
    engine = VLLMServerEngine(servers.urls, tokenizer, sampling, supervisor=servers, publisher="reload", ...)

The policy is written once to a private folder (`rollout.policy_folder.write_policy_folder`: config, FP32 weights,
generation config, tokenizer; a PEFT policy's base weights alone when its adapter is published as LoRA); every
server loads it from there, on a free port, under a guard that stops it with the trainer (`vllm_launch`). The
servers start in parallel, with a progress line: on two CPU cores one takes 40–80 s.

`ManagedVLLMServers` is the engine's `ServerSupervisor`: a server whose process died is reported at once (exit code,
log tail) and restarted on request from the same folder, on a new port; the engine then re-publishes the current
policy version to it before it gets requests again, and resends the lost requests with their seeds.

Weights after each step: `managed_publisher` — 'reload' (a checkpoint folder loaded through dev-mode
`/collective_rpc`, CPU or GPU) unless the config names 'lora' (adapter hot-loading; the servers start with
`--enable-lora`) or 'nccl' (TRL's weight transfer: the servers run `trl vllm-serve`, GPU only).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, RolloutError
from .policy_folder import write_policy_folder
from .tempdir import OwnedTempDir
from .vllm_launch import VLLMInstall, VLLMServerProcess, first_error, log_tail

logger = logging.getLogger(__name__)

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # --max-lora-rank values vLLM 0.32 accepts


@dataclass(frozen=True)
class ManagedVLLMOptions:
    """How each managed server runs (from the config's rollout fields)."""

    install: VLLMInstall  # the interpreter that runs `vllm serve`
    kv_cache_gib: float | None = 1.0  # CPU builds: KV cache size (--kv-cache-memory-bytes); None on a GPU build
    gpu_memory_utilization: float | None = None  # GPU builds: the share of GPU memory vLLM may take
    max_model_len: int | None = None  # --max-model-len; None: the model's own context length
    lora_rank: int | None = None  # the published adapter's rank: servers start with --enable-lora; None: without
    launcher: str = "vllm"  # "trl": TRL's `trl vllm-serve` (NCCL weight transfer)
    extra_args: tuple[str, ...] = ()  # more `vllm serve` arguments (rollout_vllm_args)
    startup_timeout: float = 600.0  # seconds until a server must answer /health
    num_threads: int | None = None  # CPU builds: OpenMP threads of each server (OMP_NUM_THREADS); None: vLLM's
    host: str = "127.0.0.1"


def lora_rank_flag(rank: int) -> int:
    """The smallest `--max-lora-rank` vLLM accepts that holds an adapter of rank `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigurationError(f"a LoRA rank of {rank} is above vLLM's largest --max-lora-rank "
                             f"({VLLM_LORA_RANKS[-1]}); use a smaller r or vllm_weight_publisher='reload'")


def managed_publisher(configured: str, *, directory: bool = False) -> tuple[str, str]:
    """`(publisher, reason)` for managed servers: what `vllm_weight_publisher` names, 'auto' → 'reload'."""
    if configured == "http":
        raise ConfigurationError("vllm_weight_publisher='http' is the embedded servers' format; managed vLLM servers "
                                 "load 'reload' (checkpoints), 'lora' (adapters) or 'nccl' (GPU)")
    if configured != "auto":
        return configured, "asked for"
    where = "vllm_publish_dir" if directory else "the trainer's temp folder"
    return "reload", (f"managed vLLM servers on this machine reload full-weight checkpoints from {where} through "
                      "dev-mode /collective_rpc (set 'lora' to hot-load a PEFT adapter instead)")


class _StartProgress:
    """One progress line while servers start (stderr, redrawn about once a second)."""

    def __init__(self, replicas: int, install: VLLMInstall) -> None:
        from tqdm.auto import tqdm

        build = "CPU" if install.cpu else "GPU"
        self._bar = tqdm(desc=f"starting {replicas} vLLM rollout server(s) ({build} build; ~1 min on 2 cores)",
                         bar_format="{desc}: {elapsed}", file=sys.stderr)
        self._lock = threading.Lock()

    def tick(self, seconds: float) -> None:
        with self._lock:
            self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


class ManagedVLLMServers:
    """`vllm serve` processes started by this process, and their supervisor (`ServerSupervisor`)."""

    def __init__(self, servers: list[VLLMServerProcess], folder: OwnedTempDir, options: ManagedVLLMOptions,
                 start_seconds: float) -> None:
        self.servers, self.folder, self.options = servers, folder, options
        self.start_seconds = start_seconds  # wall time until every server answered /health
        self._lock = threading.Lock()
        self._closed = False
        self._starts = [1] * len(servers)

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @classmethod
    def start(cls, model: Any, tokenizer: Any, options: ManagedVLLMOptions, *, replicas: int = 1,
              without_adapters: bool = False) -> ManagedVLLMServers:
        if replicas < 1:
            raise ValueError(f"replicas={replicas} must be >= 1")
        folder = OwnedTempDir("thundersync-vllm-")
        servers: list[VLLMServerProcess] = []
        started = time.perf_counter()
        try:
            model_dir = write_policy_folder(model, tokenizer, folder.path / "policy", without_adapters=without_adapters)
            servers = [_server(options, model_dir, folder.path / f"server-{i}.log") for i in range(replicas)]
            _start_all(servers, options.install)
        except BaseException:
            for server in servers:
                server.stop()
            folder.close()
            raise
        seconds = time.perf_counter() - started
        logger.warning("%d vLLM rollout server(s) ready in %.0f s: %s", replicas, seconds,
                       ", ".join(s.url for s in servers))
        return cls(servers, folder, options, seconds)

    def exit_status(self, index: int) -> str | None:
        """None while server `index` runs; else its exit code and log tail."""
        server = self.servers[index]
        code = server.exit_code()
        if code is None:
            return None
        signal_note = f" (signal {code - 128})" if code > 128 else ""
        return (f"(vllm serve, port {server.port}) exited with code {code}{signal_note}; its log "
                f"({server.log_path}):\n{log_tail(server.log_path)}")

    def root_cause(self, index: int) -> str | None:
        """The first error server `index` logged (why its engine died), or None."""
        return first_error(self.servers[index].log_path)

    def restart(self, index: int) -> str:
        """Start server `index` again from the policy folder on a new port; returns its URL once /health answers.
        The caller re-publishes the current policy version."""
        with self._lock:
            if self._closed:
                raise RolloutError("the managed vLLM servers are closed")
            old = self.servers[index]
            old.stop()
            log = self.folder.path / f"server-{index}.restart{self._starts[index]}.log"
            self._starts[index] += 1
            server = _server(self.options, Path(old.model), log)
            self.servers[index] = server
        server.start()
        return server.url

    def close(self) -> None:
        with self._lock:
            self._closed = True
            servers = list(self.servers)
        threads = [threading.Thread(target=s.stop, daemon=True) for s in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.folder.close()


def _server(options: ManagedVLLMOptions, model_dir: Path, log: Path) -> VLLMServerProcess:
    lora = options.lora_rank is not None
    cpu_threads = options.install.cpu and options.num_threads is not None
    threads = {"OMP_NUM_THREADS": str(options.num_threads)} if cpu_threads else {}
    serve = {"dtype": "float32", "max_model_len": options.max_model_len, "enable_lora": lora,
             "max_lora_rank": lora_rank_flag(options.lora_rank) if lora else 16,
             "extra_args": tuple(options.extra_args), "launcher": options.launcher,
             "gpu_memory_utilization": None if options.install.cpu else options.gpu_memory_utilization}
    return VLLMServerProcess(options.install, model_dir, port=0, host=options.host,
                             startup_timeout=options.startup_timeout,
                             kv_cache_gib=options.kv_cache_gib if options.install.cpu else None, serve_kwargs=serve,
                             log_path=log, kv_cache_setting="rollout_vllm_kv_cache_gib",
                             extra_env=threads)


def _start_all(servers: Sequence[VLLMServerProcess], install: VLLMInstall) -> None:
    """Start every server at once (each loads the model in its own processes); the first failure is raised after
    all have ended their start."""
    progress = _StartProgress(len(servers), install)
    errors: list[BaseException] = []

    def start(server: VLLMServerProcess) -> None:
        try:
            server.on_wait = progress.tick
            server.start()
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in this thread)
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(server,), daemon=True) for server in servers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        progress.close()
    if errors:
        raise errors[0]
