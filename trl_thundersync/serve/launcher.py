"""Start embedded rollout servers from a policy in memory: each one is `python -m trl_thundersync.serve` in its own
process on a free loopback port, serving the policy's current weights.

    servers = EmbeddedServers.start(policy, tokenizer, replicas=2, policy_version=0)
    engine = VLLMServerEngine(servers.urls, tokenizer, sampling, policy_version=0, on_close=servers.close)

The policy (LoRA merged, `rollout.weights.policy_state_dict`) is written once to a private folder with its config,
generation config and tokenizer; every server loads it from there. A server exits on SIGTERM (sent by `close()`) and
by itself when the process that started it is gone (`--exit-with-parent`), so a crashed trainer leaves no server
behind. Each server's output goes to `server-<i>.log` in that folder; a server that does not come up fails with its
log's tail in the message.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RolloutError
from ..rollout.weights import base_config, policy_state_dict, unwrap_model

_READY = re.compile(r"thundersync-serve: .* on (http://[^\s]+)")
_POLL_S = 0.1


def write_policy_folder(model: Any, tokenizer: Any, directory: Path, *, without_adapters: bool = False) -> Path:
    """Save what a server needs to serve `model` as it is now: config, FP32 weights, generation config, tokenizer.

    `without_adapters`: for a PEFT policy, the base weights alone (LoRA disabled) — what a server that will receive
    the adapter through `/v1/load_lora_adapter` must hold; otherwise the LoRA delta is merged in.
    """
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    base_config(model).save_pretrained(directory)
    inner = unwrap_model(model)
    if without_adapters and hasattr(inner, "disable_adapter"):
        with inner.disable_adapter():
            state = policy_state_dict(inner)
    else:
        state = policy_state_dict(inner)
    save_file(state, str(directory / "model.safetensors"))
    inner = unwrap_model(model)
    generation_config = getattr(inner, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


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
            raise RolloutError(f"the embedded rollout server exited with code {process.returncode} before it was "
                               f"ready; its log ({log_path}):\n{log_path.read_text(errors='replace')[-3000:]}")
        if time.monotonic() > deadline:
            raise RolloutError(f"the embedded rollout server did not report its address within {timeout:g} s; its "
                               f"log ({log_path}):\n{log_path.read_text(errors='replace')[-3000:]}")
        time.sleep(_POLL_S)


def _stop(processes: Sequence[subprocess.Popen], root: Path) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=15.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15.0)
    shutil.rmtree(root, ignore_errors=True)


class EmbeddedServers:
    """Embedded rollout servers started by this process; `close()` stops them and removes their folder."""

    def __init__(self, processes: list[subprocess.Popen], urls: list[str], root: Path) -> None:
        self.processes, self.urls, self.root = processes, urls, root
        self._finalizer = weakref.finalize(self, _stop, processes, root)

    @classmethod
    def start(cls, model: Any, tokenizer: Any, *, replicas: int = 1, policy_version: int = 0,
              options: ServerOptions = ServerOptions(), without_adapters: bool = False) -> EmbeddedServers:
        if replicas < 1:
            raise ValueError(f"replicas={replicas} must be >= 1")
        root = Path(tempfile.mkdtemp(prefix="thundersync-serve-"))
        processes: list[subprocess.Popen] = []
        try:
            model_dir = write_policy_folder(model, tokenizer, root / "policy", without_adapters=without_adapters)
            logs = [root / f"server-{i}.log" for i in range(replicas)]
            processes.extend(_spawn(model_dir, log, options, policy_version) for log in logs)  # load in parallel
            urls = [_await_address(p, log, options.startup_timeout) for p, log in zip(processes, logs)]
        except BaseException:
            _stop(processes, root)
            raise
        return cls(processes, urls, root)

    def close(self) -> None:
        self._finalizer()  # idempotent; also runs at garbage collection and interpreter exit



def start_embedded_engine(model: Any, tokenizer: Any, sampling: Any, *, replicas: int = 1, policy_version: int = 0,
                          options: ServerOptions = ServerOptions(), publisher: Any = "auto",
                          **engine_kwargs: Any) -> Any:
    """Start `replicas` embedded servers serving `model` and a `VLLMServerEngine` over them (closing it stops them).

    With `publisher="lora"` the servers hold the base weights and the policy's adapter is published (loaded as
    `policy-v{policy_version}`) before this returns; otherwise they start with the merged policy weights.
    """
    from ..rollout.vllm_client import VLLMServerEngine

    lora = publisher == "lora"
    servers = EmbeddedServers.start(model, tokenizer, replicas=replicas, policy_version=policy_version,
                                    options=options, without_adapters=lora)
    engine = None
    try:
        engine = VLLMServerEngine(servers.urls, tokenizer, sampling, policy_version=policy_version,
                                  publisher=publisher, on_close=servers.close, **engine_kwargs)
        if lora:
            engine.publish(model, policy_version)
        return engine
    except BaseException:
        if engine is not None:
            engine.close()
        servers.close()
        raise
