"""How θ_{k+1} reaches every rollout server: the weight-publication strategies of `VLLMServerEngine`.

A `WeightPublisher` is used by the engine once per optimizer step (paper Algorithm 1, line 27):

1. `prepare(model, version)` — once, on the trainer: write the weights file, save the adapter, note the model.
2. `push(url, version)` — once per replica (concurrently when `concurrent`): load the version, reset the prefix
   cache (full weights: store the version's label on the server, `server_acks`), and return only once the replica
   *acknowledged* serving it; raise `RolloutError` otherwise.
3. `retire(urls, previous_version)` — after every replica acknowledged: free what the previous version held.
4. `confirm(url, version) -> str | None` — before each batch: why the replica no longer confirms `version` (it
   restarted, or another trainer published to it), or None.
5. `restore(url, version) -> bool` — after a replica restarted (it came back with the weights it was started with):
   put `version` back, or return False when this strategy cannot (the engine then fails loudly).
6. `close()` — unload what is still loaded (the last adapter) and remove local artifacts.

Names: every publisher has a `prefix` `policy-<run id>` (`server_acks.new_run_id`); version k is served and
labelled `policy-<run id>-v{k}`. A server that outlives a run, or is reused after `resume_from_checkpoint`, thus
never sees a name twice (vLLM refuses a loaded adapter name with HTTP 400).

Strategies:

- `HTTPWeightFile` (embedded server, full weights, CPU): `policy_state_dict(model)` (LoRA merged) is written once to
  a safetensors file; each replica loads it through `POST /thundersync/update_weights {"path", "policy_version"}`,
  which drains in-flight requests, swaps atomically and answers with the version it now serves. The path must be
  readable by the servers (same machine, or `directory` on a filesystem they share).
- `LoRAAdapterPublisher` (vLLM or embedded, LoRA): the adapter is saved as `policy-<run>-v{k}/` and hot-loaded
  through vLLM's `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`; the acknowledgement is the name listed by
  `GET /v1/models`. Requests then name the adapter, and vLLM echoes it in every response, so each sample carries
  the version that produced it. The previous adapter is unloaded after the switch, the last one at `close()`.
  vLLM opens `lora_path` on its own filesystem: for a server on another host, `directory` must be a folder both
  machines mount at the same path (the config's `vllm_publish_dir`). Before its first adapter, and before every
  batch, it reads the server's weight label (`GET /weight_info`): a base other than the checkpoint the server
  started with (`base_label`, vLLM's "default"), e.g. `policy-<run>-v2` left by a full-weight run, is refused with
  `ServerBaseWeightsError` — adapters trained on the policy's base would sample from other weights.
- `CheckpointReloadPublisher` (`vllm_reload.py`; vLLM, full weights, CPU or GPU, no NCCL): a checkpoint folder
  loaded by vLLM's dev-mode `POST /collective_rpc` `reload_weights`.
- `TRLNCCLPublisher` (vLLM, full weights, GPU): TRL 1.16's own weight-transfer client
  (`trl.generation.vllm_client.VLLMClient`: `/init_weight_transfer_engine`, `/start_weight_update`,
  `/update_weights` with an NCCL broadcast, `/finish_weight_update`), then `/reset_prefix_cache` (retried while
  vLLM answers `{"success": false}`). The tensors are streamed in the model's dtype from its device (a LoRA policy
  is merged one layer at a time: `weights.policy_tensors`). It cannot restore a restarted replica. It needs a CUDA
  device (TRL's client refuses any other): refused at construction, naming the alternatives.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from ..errors import ConfigurationError, RolloutError, ServerBaseWeightsError, UnsupportedOptionError
from .server_acks import (
    RESTARTING,
    Acknowledgements,
    adapter_load_error,
    new_run_id,
    read_weight_version,
    reset_prefix_cache,
    route_absent,
)
from .tempdir import OwnedTempDir
from .vllm_api import error_message, http_call, lora_name, parse_model_ids
from .weights import policy_state_dict, policy_tensors, unwrap_model

__all__ = ["ArtifactDir", "HTTPWeightFile", "LoRAAdapterPublisher", "TRLNCCLPublisher", "WeightPublisher",
           "reset_prefix_cache"]

logger = logging.getLogger(__name__)
_CLOSE_TIMEOUT_S = 10.0  # per server, for unloading the last adapter at close()
SERVER_START_LABEL = "default"  # the weight label vLLM (and the embedded server) report before any publication
_FULL_WEIGHT_CHOICES = ("'reload' (a checkpoint folder loaded through vLLM's dev-mode /collective_rpc, CPU or GPU), "
                        "'nccl' (TRL's NCCL transfer, GPU) or 'lora' (adapters, a PEFT policy)")


@runtime_checkable
class WeightPublisher(Protocol):
    lora: bool  # True: requests name the version's adapter, and the version is read back from the response's model
    concurrent: bool  # True: push() may run for all replicas at once
    prefix: str  # "policy-<run id>": version k is served / labelled `lora_name(prefix, k)`

    def prepare(self, model: Any, version: int) -> None: ...

    def push(self, url: str, version: int) -> None: ...

    def retire(self, urls: Sequence[str], previous_version: int) -> None: ...

    def confirm(self, url: str, version: int) -> str | None: ...

    def restore(self, url: str, version: int) -> bool: ...

    def close(self) -> None: ...


class ArtifactDir:
    """Where a publisher writes its artifacts: a private temporary folder (an `OwnedTempDir`, made at the first
    publication and removed however this process ends), inside `directory` when one is given (a folder the
    servers can read; the private folder is made readable by other users, since a server may run as one)."""

    def __init__(self, directory: str | Path | None, what: str) -> None:
        self._given = None if directory is None else Path(directory)
        self._prefix = f"thundersync-{what}-"
        self._owned: OwnedTempDir | None = None

    @property
    def root(self) -> Path:
        if self._owned is None:
            if self._given is not None:
                self._given.mkdir(parents=True, exist_ok=True)
            self._owned = OwnedTempDir(self._prefix, parent=self._given,
                                       mode=None if self._given is None else 0o755)
        return self._owned.path

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()


class HTTPWeightFile:
    """Full weights to embedded servers through a safetensors file and `POST /thundersync/update_weights`."""

    lora = False
    concurrent = True

    def __init__(self, directory: str | Path | None = None, *, timeout: float = 600.0, prefix: str = "policy",
                 run_id: str | None = None) -> None:
        self._dir = ArtifactDir(directory, "weights")
        self.timeout = timeout
        self.prefix = f"{prefix}-{run_id or new_run_id()}"
        self._acks = Acknowledgements(timeout)
        self._path: Path | None = None  # file of the latest prepared version
        self._version: int | None = None
        self._previous: Path | None = None

    def prepare(self, model: Any, version: int) -> None:
        from safetensors.torch import save_file

        path = self._dir.root / f"{lora_name(self.prefix, version)}.safetensors"
        save_file(policy_state_dict(model), str(path))  # tensors are separate FP32 clones: no shared storage
        self._previous, self._path, self._version = self._path, path, version

    def push(self, url: str, version: int) -> None:
        if self._path is None or self._version != version:
            raise RolloutError(f"push of version {version} before prepare()")
        payload = {"path": str(self._path.resolve()), "policy_version": version}
        reply = http_call(url, "POST", "/thundersync/update_weights", payload, timeout=self.timeout)
        if route_absent(reply):
            raise ConfigurationError(
                f"vllm_weight_publisher='http' loads full weights through the embedded server's POST "
                f"/thundersync/update_weights, which {url} does not serve (a vLLM server?); for vLLM use "
                f"{_FULL_WEIGHT_CHOICES}")
        if reply.status != 200:
            raise RolloutError(f"{url} refused the weights of version {version}: HTTP {reply.status} "
                               f"{error_message(reply)}")
        acknowledged = (reply.json() or {}).get("policy_version")
        if acknowledged != version or reply.policy_version != version:
            raise RolloutError(f"{url} acknowledged version {acknowledged} (header {reply.policy_version}) instead "
                               f"of {version}")
        reset_prefix_cache(url, self.timeout)
        self._acks.record(url, lora_name(self.prefix, version))

    def retire(self, urls: Sequence[str], previous_version: int) -> None:
        if self._previous is not None and self._previous != self._path:
            self._previous.unlink(missing_ok=True)
        self._previous = None

    def confirm(self, url: str, version: int) -> str | None:
        return self._acks.problem(url, lora_name(self.prefix, version))

    def restore(self, url: str, version: int) -> bool:
        if self._version != version or self._path is None or not self._path.exists():
            return False
        self.push(url, version)
        return True

    def close(self) -> None:
        self._dir.close()


class LoRAAdapterPublisher:
    """LoRA adapters hot-loaded under per-run versioned names through `POST /v1/load_lora_adapter`."""

    lora = True
    concurrent = True

    def __init__(self, directory: str | Path | None = None, *, prefix: str = "policy", timeout: float = 600.0,
                 run_id: str | None = None, base_label: str = SERVER_START_LABEL) -> None:
        self._dir = ArtifactDir(directory, "lora")
        self.prefix, self.timeout = f"{prefix}-{run_id or new_run_id()}", timeout
        self.base_label = base_label  # the weight label of a server holding the checkpoint it was started with
        self._unlabelled: set[str] = set()  # servers without /weight_info (base not checkable; logged once each)
        self._path: Path | None = None  # adapter folder (adapter_config.json + weights) of the latest version
        self._version: int | None = None
        self._previous: Path | None = None
        self._loaded: dict[str, int] = {}  # url -> the version whose adapter it has loaded (unloaded at close)

    def prepare(self, model: Any, version: int) -> None:
        peft_model = unwrap_model(model)
        configs = getattr(peft_model, "peft_config", None)
        if not configs or not hasattr(peft_model, "save_pretrained"):
            raise ConfigurationError("LoRA publication needs a peft.PeftModel policy (pass peft_config to the trainer)")
        if len(configs) != 1 or next(iter(configs.values())).peft_type != "LORA":
            raise UnsupportedOptionError(f"LoRA publication serves exactly one LoRA adapter; the policy has "
                                         f"{ {name: c.peft_type for name, c in configs.items()} }")
        target = self._dir.root / lora_name(self.prefix, version)
        peft_model.save_pretrained(str(target), safe_serialization=True)
        adapter = next(iter(configs))
        if not (target / "adapter_config.json").exists():  # PEFT nests non-default adapters in a subfolder
            target = target / adapter
        self._previous, self._path, self._version = self._path, target, version

    def push(self, url: str, version: int) -> None:
        if self._path is None or self._version != version:
            raise RolloutError(f"push of version {version} before prepare()")
        if url not in self._loaded:
            self.check_base(url)  # also at engine start (`check_base`) and before every batch (confirm)
        name, path = lora_name(self.prefix, version), str(self._path.resolve())
        payload = {"lora_name": name, "lora_path": path, "load_inplace": False}
        reply = http_call(url, "POST", "/v1/load_lora_adapter", payload, timeout=self.timeout)
        if reply.status != 200:
            raise adapter_load_error(url, name, path, reply)
        self._loaded[url] = version
        reset_prefix_cache(url, self.timeout)
        if name not in self._served(url):
            raise RolloutError(f"{url} accepted adapter {name!r} but /v1/models does not list it")

    def retire(self, urls: Sequence[str], previous_version: int) -> None:
        name = lora_name(self.prefix, previous_version)
        for url in urls:
            self._unload(url, name, self.timeout)
        if self._previous is not None and self._previous != self._path:
            shutil.rmtree(self._previous, ignore_errors=True)
        self._previous = None

    def confirm(self, url: str, version: int) -> str | None:
        """The adapter's name listed by `/v1/models` is the acknowledgement (any vLLM version, no dev mode; no
        server-wide weight label, which other runs sharing a LoRA server would overwrite)."""
        name = lora_name(self.prefix, version)
        if url not in self._loaded:
            return None  # nothing was published there (yet): the engine samples the base model
        self.check_base(url)
        if name not in self._served(url):
            return f"no longer lists adapter {name!r} in /v1/models (it restarted since the adapter was loaded)"
        return None

    def restore(self, url: str, version: int) -> bool:
        if self._version != version or self._path is None or not self._path.exists():
            return False
        if lora_name(self.prefix, version) not in self._served(url):
            self.push(url, version)
        return True

    def close(self) -> None:
        """Unload the last adapter from every server that has it (a long-lived server keeps no adapter of this run),
        then remove the adapter folders."""
        try:
            for url, version in list(self._loaded.items()):
                self._unload(url, lora_name(self.prefix, version), _CLOSE_TIMEOUT_S)
            self._loaded.clear()
        finally:
            self._dir.close()

    def _unload(self, url: str, name: str, timeout: float) -> None:
        try:
            reply = http_call(url, "POST", "/v1/unload_lora_adapter", {"lora_name": name}, timeout=timeout)
        except OSError as exc:
            reply, detail = None, str(exc)
        else:
            detail = error_message(reply)
        if reply is None or reply.status not in (200, 404):  # 404: never loaded there (the initial policy)
            warnings.warn(f"{url} kept adapter {name!r} loaded ({detail}); requests name the new version, so "
                          "no sample uses it, but it holds server memory", RuntimeWarning, stacklevel=3)
        elif self._loaded.get(url) is not None and lora_name(self.prefix, self._loaded[url]) == name:
            del self._loaded[url]

    def check_base(self, url: str) -> None:
        """Refuse a server whose base weights a full-weight publication replaced (its `/weight_info` label). The
        engine calls it for every replica at start, before the first batch samples from the base model."""
        label = read_weight_version(url, self.timeout)
        if label is None:
            if url not in self._unlabelled:
                self._unlabelled.add(url)
                logger.warning("%s has no GET /weight_info (vLLM < 0.27, or VLLM_SERVER_DEV_MODE unset): its base "
                               "weights cannot be checked before LoRA adapters are loaded on it", url)
            return
        if label != self.base_label:
            raise ServerBaseWeightsError(
                f"{url} serves base weights labelled {label!r} (GET /weight_info), not the checkpoint it was "
                f"started with ({self.base_label!r}): a full-weight publication replaced them (another run's "
                "vllm_weight_publisher='reload' or 'nccl'), so this run's LoRA adapters would sample from other "
                "weights than the policy's. Restart the server (it loads its checkpoint again) or give this run "
                "its own server", url=url, label=label)

    def _served(self, url: str) -> list[str]:
        reply = http_call(url, "GET", "/v1/models", timeout=self.timeout)
        if reply.status in RESTARTING:
            raise ConnectionError(f"{url} /v1/models: HTTP {reply.status} (restarting)")
        if reply.status != 200:
            raise RolloutError(f"{url} /v1/models failed: HTTP {reply.status} {error_message(reply)}")
        return parse_model_ids(reply.json())


class TRLNCCLPublisher:
    """Full weights to real vLLM servers with TRL 1.16's NCCL weight-transfer client (GPU only)."""

    lora = False
    concurrent = False  # one NCCL group per replica; broadcasts run one after the other

    def __init__(self, *, device: Any = "cuda", dtype: torch.dtype | None = None, group_port: int = 51216,
                 connection_timeout: float = 240.0, client_factory: Callable[..., Any] | None = None,
                 timeout: float = 600.0, prefix: str = "policy", run_id: str | None = None) -> None:
        if client_factory is None:
            _require_cuda(device)
            client_factory = _trl_vllm_client_class()
        self.device, self.dtype, self.group_port = device, dtype, group_port
        self.connection_timeout, self.timeout = connection_timeout, timeout
        self.prefix = f"{prefix}-{run_id or new_run_id()}"
        self._acks = Acknowledgements(timeout)
        self._factory = client_factory
        self._clients: dict[str, Any] = {}
        self._model: Any = None  # the policy the latest prepare() noted; its tensors are streamed at push()
        self._metadata: list[tuple[str, str, list[int]]] = []  # (name, vLLM dtype name, shape), in stream order
        self._version: int | None = None

    def prepare(self, model: Any, version: int) -> None:
        specs = [(name, self.dtype or dtype, shape) for name, dtype, shape in policy_tensors(model, specs=True)]
        self._metadata = [(name, str(dtype).removeprefix("torch."), list(shape)) for name, dtype, shape in specs]
        self._model, self._version = model, version

    def push(self, url: str, version: int) -> None:
        if self._version != version:
            raise RolloutError(f"push of version {version} before prepare()")
        client = self._client(url)
        stream = ((name, t.to(device=self.device, dtype=self.dtype or t.dtype))  # no copy when already there
                  for name, t in policy_tensors(self._model))
        try:
            client.update_named_params(self._metadata, stream)  # start → update (NCCL broadcast) → finish
        except Exception as exc:  # TRL's client raises bare Exception on HTTP errors
            raise RolloutError(f"NCCL weight update of {url} to version {version} failed: {exc}") from exc
        reset_prefix_cache(url, self.timeout)  # TRL's own call ignores vLLM >= 0.26's {"success": false}
        self._acks.record(url, lora_name(self.prefix, version))

    def retire(self, urls: Sequence[str], previous_version: int) -> None:
        return None

    def confirm(self, url: str, version: int) -> str | None:
        return self._acks.problem(url, lora_name(self.prefix, version))

    def restore(self, url: str, version: int) -> bool:
        return False  # the restarted server lost its NCCL group and θ_k; only the trainer holds θ_k

    def close(self) -> None:
        for client in self._clients.values():
            close = getattr(client, "close_communicator", None)
            if close is not None:
                close()
        self._clients.clear()
        self._model, self._metadata = None, []

    def _client(self, url: str) -> Any:
        if url not in self._clients:
            port = self.group_port + len(self._clients)  # one rendezvous port per replica
            try:
                client = self._factory(base_url=url, group_port=port, connection_timeout=self.connection_timeout)
                client.init_communicator(device=self.device)
            except NotImplementedError as exc:  # TRL 1.16 on a device NCCL cannot use
                raise ConfigurationError(f"vllm_weight_publisher='nccl' cannot publish from device {self.device!r}: "
                                         f"{exc}; use {_FULL_WEIGHT_CHOICES}") from exc
            except Exception as exc:  # TRL's client raises bare Exception (HTTP) and whatever NCCL raises
                raise RolloutError(f"TRL's NCCL client could not open a weight-transfer group with {url} (group "
                                   f"port {port}): {type(exc).__name__}: {exc}") from exc
            self._clients[url] = client
        return self._clients[url]


def _require_cuda(device: Any) -> None:
    """TRL's NCCL client publishes from a CUDA device only; anything else is refused before a server is called."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ConfigurationError(f"TRLNCCLPublisher: device={device!r} is not a torch device") from exc
    if kind != "cuda":
        raise ConfigurationError(f"vllm_weight_publisher='nccl' sends weights over NCCL from a CUDA device, but the "
                                 f"learner's device is {device!r}; use {_FULL_WEIGHT_CHOICES}")


def _trl_vllm_client_class() -> Callable[..., Any]:
    try:
        import vllm  # noqa: F401  (TRL's client refuses to start without it)
        from trl.generation.vllm_client import VLLMClient
    except ImportError as exc:
        raise ConfigurationError(
            "vllm_weight_publisher='nccl' needs vLLM and TRL's weight-transfer client in the trainer's environment: "
            'pip install "trl-thundersync[vllm]" (GPU machines only); without them use vllm_weight_publisher='
            "'reload' (a checkpoint folder the servers read) or 'lora' (adapters)"
        ) from exc
    return VLLMClient
