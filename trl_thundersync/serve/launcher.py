"""Start embedded rollout servers from a policy in memory: each one is `python -m trl_thundersync.serve` in its own
process on a free loopback port, serving the policy's current weights.

    servers = EmbeddedServers.start(policy, tokenizer, replicas=2, policy_version=0)
    engine = VLLMServerEngine(servers.urls, tokenizer, sampling, policy_version=0, on_close=servers.close)

The policy (LoRA merged, `rollout.weights.policy_state_dict`) is written once to a private folder with its config,
generation config and tokenizer; every server loads it from there. A server exits on SIGTERM (sent by `close()`) and
by itself when the process that started it is gone (`--exit-with-parent`), so a crashed trainer leaves no server
behind. The folder is an `OwnedTempDir`: removed by `close()`, and by its reaper when this process ends in any way
(SIGTERM and SIGKILL included). Each server's output goes to `server-<i>.log` in that folder; a server that does not
come up fails with its log's tail in the message.

`EmbeddedServers` is the engine's `ServerSupervisor` (`rollout.vllm_replicas`): it tells the engine at once when a
server's process has died (exit code, log tail), and restarts it from the same policy folder on request (a new
port; the engine re-publishes the current policy version before the server gets requests again).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RolloutError
from ..rollout.policy_folder import write_policy_folder
from ..rollout.publish_role import SINGLE_PROCESS, PublishRole, run_on_main
from ..rollout.tempdir import OwnedTempDir

_READY = re.compile(r"thundersync-serve: .* on (http://[^\s]+)")
_POLL_S = 0.1
_LOG_TAIL = 3000  # characters of a server's log quoted in an error


@dataclass(frozen=True)
class ServerOptions:
    """How each embedded server runs."""

    max_in_flight: int = 16  # requests one server decodes concurrently
    num_threads: int = 1  # torch intra-op threads per server
    startup_timeout: float = 180.0  # seconds until the server must print its address
    host: str = "127.0.0.1"


def _spawn(model_dir: Path, log_path: Path, options: ServerOptions, policy_version: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "trl_thundersync.serve", "--model", str(model_dir), "--host", options.host,
               "--port", "0", "--max-in-flight", str(options.max_in_flight), "--num-threads",
               str(options.num_threads), "--policy-version", str(policy_version), "--log-level", "warning",
               "--exit-with-parent"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with log_path.open("ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def _await_address(process: subprocess.Popen, log_path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        match = _READY.search(log_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if process.poll() is not None:
            raise RolloutError(f"the embedded rollout server {_ended(process, log_path)} before it was ready")
        if time.monotonic() > deadline:
            raise RolloutError(f"the embedded rollout server did not report its address within {timeout:g} s; its "
                               f"log ({log_path}):\n{log_path.read_text(errors='replace')[-_LOG_TAIL:]}")
        time.sleep(_POLL_S)


def _ended(process: subprocess.Popen, log_path: Path) -> str:
    """How an exited server ended, for error messages: '(pid N) exited with code C' or '... was killed by SIGKILL',
    then its log's tail."""
    code = process.returncode
    how = f"exited with code {code}"
    if code < 0:
        try:
            how += f" (killed by {signal.Signals(-code).name})"
        except ValueError:
            pass  # not a known signal number: the code says enough
    try:
        tail = log_path.read_text(errors="replace")[-_LOG_TAIL:]
    except OSError as exc:
        tail = f"<unreadable: {exc}>"
    return f"(pid {process.pid}) {how}; its log ({log_path}):\n{tail}"


def _stop(processes: Sequence[subprocess.Popen], folder: OwnedTempDir) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=15.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15.0)
    folder.close()


class EmbeddedServers:
    """Embedded rollout servers started by this process, and their supervisor (`ServerSupervisor`): `close()`
    stops them and removes their folder."""

    def __init__(self, processes: list[subprocess.Popen], urls: list[str], folder: OwnedTempDir, *,
                 logs: list[Path], options: ServerOptions, policy_version: int) -> None:
        self.processes, self.urls, self.folder = processes, urls, folder  # processes[i] serves urls[i]
        self.logs, self.options, self.policy_version = logs, options, policy_version
        self._lock = threading.Lock()  # a restart and close() do not interleave
        self._closed = False
        self._starts = [1] * len(processes)  # processes started per slot (names each restart's log)
        self._finalizer = weakref.finalize(self, _stop, processes, folder)  # stops restarted processes too

    @property
    def root(self) -> Path:
        return self.folder.path

    @classmethod
    def start(cls, model: Any, tokenizer: Any, *, replicas: int = 1, policy_version: int = 0,
              options: ServerOptions = ServerOptions(), without_adapters: bool = False) -> EmbeddedServers:
        if replicas < 1:
            raise ValueError(f"replicas={replicas} must be >= 1")
        folder = OwnedTempDir("thundersync-serve-")
        processes: list[subprocess.Popen] = []
        try:
            model_dir = write_policy_folder(model, tokenizer, folder.path / "policy", without_adapters=without_adapters)
            logs = [folder.path / f"server-{i}.log" for i in range(replicas)]
            processes.extend(_spawn(model_dir, log, options, policy_version) for log in logs)  # load in parallel
            urls = [_await_address(p, log, options.startup_timeout) for p, log in zip(processes, logs, strict=True)]
        except BaseException:
            _stop(processes, folder)
            raise
        return cls(processes, urls, folder, logs=logs, options=options, policy_version=policy_version)

    def exit_status(self, index: int) -> str | None:
        """None while server `index` runs; else its pid, exit code (or signal) and log tail."""
        process = self.processes[index]
        if process.poll() is None:
            return None
        return _ended(process, self.logs[index])

    def restart(self, index: int) -> str:
        """Start server `index` again from the policy folder (the version it was first started with, on a new port);
        returns its URL once it listens. The caller re-publishes the current policy version to it."""
        with self._lock:
            if self._closed:
                raise RolloutError("the embedded rollout servers are closed")
            old = self.processes[index]
            if old.poll() is None:  # restart a hung server: it must not hold the policy folder or a port
                old.kill()
                old.wait(timeout=15.0)
            log = self.folder.path / f"server-{index}.restart{self._starts[index]}.log"
            self._starts[index] += 1
            process = _spawn(self.folder.path / "policy", log, self.options, self.policy_version)
            self.processes[index], self.logs[index] = process, log
        self.urls[index] = _await_address(process, log, self.options.startup_timeout)
        return self.urls[index]

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._finalizer()  # idempotent; also runs at garbage collection and interpreter exit



def start_embedded_engine(model: Any, tokenizer: Any, sampling: Any, *, replicas: int = 1, policy_version: int = 0,
                          options: ServerOptions = ServerOptions(), publisher: Any = "auto",
                          role: PublishRole = SINGLE_PROCESS,
                          **engine_kwargs: Any) -> Any:
    """Start `replicas` embedded servers serving `model` and a `VLLMServerEngine` over them (closing it stops them;
    it restarts one whose process dies, at most `max_restarts` times, an engine keyword argument).

    With `publisher="lora"` (or a `LoRAAdapterPublisher`) the servers hold the base weights and the policy's adapter
    is published (loaded as `policy-<run id>-v{policy_version}`) before this returns; otherwise they start with the
    merged policy weights.

    With several learner processes (`role`, see `rollout.publish_role`) rank 0 starts the servers and
    owns them (restarts, stops them when its engine closes); every rank receives their URLs and builds its own
    engine over them, and every rank calls this (it is a collective).
    """
    from ..rollout.vllm_client import VLLMServerEngine

    lora = publisher == "lora" or getattr(publisher, "lora", False) is True  # a name or a WeightPublisher
    servers = None

    def start() -> tuple[str, ...]:
        nonlocal servers
        servers = EmbeddedServers.start(model, tokenizer, replicas=replicas, policy_version=policy_version,
                                        options=options, without_adapters=lora)
        return tuple(servers.urls)

    urls = run_on_main(role, f"starting {replicas} embedded server(s)", start)
    engine = None
    try:
        engine = VLLMServerEngine(list(urls), tokenizer, sampling, policy_version=policy_version,
                                  publisher=publisher, supervisor=servers, role=role, **engine_kwargs)
        if lora:
            engine.publish(model, policy_version)
        return engine
    except BaseException:
        if engine is not None:
            engine.close()
        if servers is not None:
            servers.close()
        raise
