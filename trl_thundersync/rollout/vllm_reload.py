"""Full weights to vLLM servers without NCCL: a checkpoint folder both sides read, loaded by vLLM's own reload.

`vllm_weight_publisher="reload"` (`CheckpointReloadPublisher`) works wherever the servers can read a folder the
trainer writes — the same machine, or a filesystem both mount at the same path (`vllm_publish_dir`) — on CPU and on
clusters where NCCL cannot connect trainer and servers. Per version k (the `WeightPublisher` lifecycle in
`vllm_publish.py`):

1. `prepare`: `policy_state_dict(model)` (LoRA merged, FP32) is written as a Hugging Face checkpoint folder
   `<dir>/policy-<run>-v<k>/` (`model.safetensors` + `config.json`). A tied output embedding is written explicitly
   (`lm_head.weight`): vLLM's in-place reload leaves a parameter the checkpoint lacks as it was, with no error, and on
   CPU the tied `lm_head` is its own buffer (measured with vLLM 0.32's CPU build: log-prob error ~0.7-1.2 without it,
   ≤ 1e-6 with it).
2. `push(url, k)`, per replica, in vLLM's dev mode (`VLLM_SERVER_DEV_MODE=1`):

       POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": <folder>}, "timeout": s}
            -> 200 {"results": [null, ...]}   (one entry per worker; vllm/entrypoints/serve/dev/rpc/api_router.py,
                                               GPUModelRunner.reload_weights(weights_path=...), vLLM >= 0.32)
       POST /reset_prefix_cache               (cached prefixes were computed by the old weights)
       POST /weight_checker {"action": "checksum"}   (content check, `weight_digests`; optional, see below)
       POST /update_weight_version {"new_version": "policy-<run>-v<k>"};  GET /weight_info  (`server_acks`)

   The label is stored only after the content was confirmed, and read back before `push` returns.
3. `confirm` / `restore`: the label is read back before every batch; a replica that restarted reports "default"
   and gets version k reloaded from its folder (kept until version k+1 is acknowledged everywhere).

Content check: where `/weight_checker` sees the parameters (GPU), every parameter it reports is compared by SHA-256
with the checkpoint (`weight_digests.compare`); one that still holds the previous version's bytes fails the
publication. On CPU vLLM hashes repacked linear layers as empty tensors: only embeddings and norms are compared
there, and the label confirms the rest (logged once). The server hashes all its weights for this (a GPU-to-CPU
copy per publication and replica); `check_content=False` skips it.

Trap, measured: a `weights_path` the server cannot read (another host's path, a typo) makes vLLM 0.32's worker
fail, and its engine does not survive: the server exits. So without `vllm_publish_dir` (the trainer's temp folder)
a server on another host is refused before anything is sent (`is_this_machine`), and the error of a failed reload
says that the server must be restarted. A reload also points the server's `model_config.model` at the folder;
every reload here names its folder, so the folders can be removed once retired.
"""

from __future__ import annotations

import logging
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError, RolloutError
from .server_acks import Acknowledgements, new_run_id, reset_prefix_cache, route_absent
from .vllm_api import error_message, http_call, lora_name
from .vllm_publish import ArtifactDir
from .weight_digests import DTYPES, CheckpointDigests, ContentCheck, compare
from .weights import base_config, policy_state_dict, tied_output_embedding

__all__ = ["CHECKPOINT_FILE", "CheckpointReloadPublisher", "write_checkpoint"]

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "model.safetensors"
_UNREADABLE = ("Repo id must be in the form", "No such file", "does not appear to have", "Cannot find any model")


def write_checkpoint(model: Any, folder: Path) -> Path:
    """Write the weights `model` generates with (LoRA merged) as a Hugging Face checkpoint folder; returns the
    weights file. A tied output embedding is stored under its own name too (see the module docstring)."""
    from safetensors.torch import save_file

    state = policy_state_dict(model)  # separate FP32 clones: safetensors refuses shared storage, none here
    tied = tied_output_embedding(model)
    if tied is not None and tied[0] not in state and tied[1] in state:
        state[tied[0]] = state[tied[1]].clone()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CHECKPOINT_FILE
    save_file(state, str(path), metadata={"format": "pt"})
    base_config(model).to_json_file(str(folder / "config.json"))
    return path


def is_this_machine(url: str) -> bool:
    """Whether the server at `url` runs on this machine: its host resolves to an address a socket here can bind
    (loopback, or one of this machine's interfaces). Unresolvable hosts count as local: the request fails anyway."""
    host = urlsplit(url).hostname or "127.0.0.1"
    try:
        addresses = {(info[0], info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return True
    for family, address in addresses:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                continue
            return True
    return False


class CheckpointReloadPublisher:
    """Full weights to vLLM servers through a checkpoint folder and dev-mode `POST /collective_rpc reload_weights`."""

    lora = False
    concurrent = True  # every replica reads the same folder

    def __init__(self, directory: str | Path | None = None, *, timeout: float = 600.0, prefix: str = "policy",
                 run_id: str | None = None, check_content: bool = True) -> None:
        self._dir = ArtifactDir(directory, "checkpoints")
        self._shared = directory is not None  # False: the trainer's temp folder, readable on this machine only
        self._local: set[str] = set()  # servers found to run on this machine
        self.timeout, self.check_content = timeout, check_content
        self.prefix = f"{prefix}-{run_id or new_run_id()}"
        self._acks = Acknowledgements(timeout)
        self._folder: Path | None = None  # checkpoint folder of the latest prepared version
        self._version: int | None = None
        self._previous: tuple[Path, int] | None = None  # folder and version of the one before, until retired
        self._digests: dict[tuple[int, str], CheckpointDigests] = {}  # (version, server dtype) -> digests
        self._dtypes: dict[str, str | None] = {}  # url -> the dtype its /server_info reports
        self._told: set[str] = set()  # log lines already written once

    def prepare(self, model: Any, version: int) -> None:
        folder = self._dir.root / lora_name(self.prefix, version)
        write_checkpoint(model, folder)
        if self._folder is not None and self._folder != folder:
            self._previous = (self._folder, self._version)
        self._folder, self._version = folder, version

    def push(self, url: str, version: int) -> None:
        if self._folder is None or self._version != version:
            raise RolloutError(f"push of version {version} before prepare()")
        label = lora_name(self.prefix, version)
        if not self._shared and url not in self._local:
            if not is_this_machine(url):
                raise ConfigurationError(
                    f"vllm_weight_publisher='reload' writes checkpoints to this machine's temp folder, which {url} "
                    "(another host) cannot read, and vLLM's engine does not survive a failed reload: set "
                    "vllm_publish_dir to a folder both machines mount at the same path")
            self._local.add(url)
        self._reload(url, version)
        reset_prefix_cache(url, self.timeout)
        if self.check_content:
            self._confirm_content(url, version)
        self._acks.record(url, label)
        problem = self._acks.problem(url, label)
        if problem is not None:
            raise RolloutError(f"{url} reloaded version {version} but {problem}")

    def retire(self, urls: Sequence[str], previous_version: int) -> None:
        if self._previous is not None:
            shutil.rmtree(self._previous[0], ignore_errors=True)
        self._digests = {key: d for key, d in self._digests.items() if key[0] > previous_version}
        self._previous = None

    def confirm(self, url: str, version: int) -> str | None:
        return self._acks.problem(url, lora_name(self.prefix, version))

    def restore(self, url: str, version: int) -> bool:
        if self._version != version or self._folder is None or not (self._folder / CHECKPOINT_FILE).exists():
            return False
        self.push(url, version)
        return True

    def close(self) -> None:
        self._digests.clear()
        self._dir.close()

    # -- the steps of push ----------------------------------------------------------------------------------------
    def _reload(self, url: str, version: int) -> None:
        path = str(self._folder.resolve())
        payload = {"method": "reload_weights", "kwargs": {"weights_path": path}, "timeout": self.timeout}
        reply = http_call(url, "POST", "/collective_rpc", payload, timeout=self.timeout)
        if reply.status == 200:
            return
        said = f"HTTP {reply.status} {error_message(reply)}"
        if route_absent(reply):
            raise RolloutError(f"{url} has no POST /collective_rpc ({said}): vllm_weight_publisher='reload' needs "
                               "vLLM >= 0.32 started with VLLM_SERVER_DEV_MODE=1 in its environment")
        if any(marker in said for marker in _UNREADABLE):
            raise RolloutError(
                f"{url} could not read the checkpoint of version {version} at {path} ({said}): the server opens "
                "weights_path on its own filesystem; a server on another host needs vllm_publish_dir set to a "
                "folder both machines mount at the same path, readable by the server's user. vLLM's engine does "
                "not survive a failed reload_weights: restart the server")
        raise RolloutError(f"{url} failed to reload version {version} from {path}: {said}")

    def _confirm_content(self, url: str, version: int) -> None:
        reply = http_call(url, "POST", "/weight_checker", {"action": "checksum"}, timeout=self.timeout)
        if route_absent(reply):
            self._tell_once("no-checker", "%s has no /weight_checker (vLLM < 0.32): the published content is "
                            "confirmed by the weight label only", url)
            return
        body = reply.json() if reply.status == 200 else None
        if not isinstance(body, dict) or not isinstance(body.get("checksums"), dict):
            raise RolloutError(f"{url} POST /weight_checker failed: HTTP {reply.status} {error_message(reply)}")
        dtype = self._server_dtype(url)
        if dtype is None:
            self._tell_once("no-dtype", "%s reports no model dtype in /server_info: the published content is "
                            "confirmed by the weight label only", url)
            return
        previous = None if self._previous is None else self._digests_of(self._previous, dtype)
        check = compare(body["checksums"], self._digests_of((self._folder, version), dtype), previous)
        if check.stale:
            raise RolloutError(
                f"{url} reloaded version {version}, but {len(check.stale)} parameter(s) still hold version "
                f"{self._previous[1]}'s bytes ({', '.join(check.stale[:4])}): the reload skipped them (a tensor "
                "missing from the checkpoint, or a name vLLM maps elsewhere); the replica would sample from mixed "
                "weights")
        self._report(url, check)

    def _report(self, url: str, check: ContentCheck) -> None:
        if not check.confirmed:
            self._tell_once("unconfirmed", "%s: no parameter could be compared by hash (%d hashed as empty, %d "
                            "laid out differently): the published content is confirmed by the weight label only",
                            url, len(check.invisible), len(check.unexplained))
        elif check.invisible or check.unexplained:
            self._tell_once("partial", "%s: %d parameter(s) confirmed by hash; %d hashed as empty (vLLM repacks "
                            "linear layers on CPU) and %d laid out differently are confirmed by the weight label "
                            "only", url, len(check.confirmed), len(check.invisible), len(check.unexplained))

    def _digests_of(self, published: tuple[Path, int], dtype: str) -> CheckpointDigests:
        folder, version = published
        key = (version, dtype)
        if key not in self._digests:
            self._digests[key] = CheckpointDigests(folder / CHECKPOINT_FILE, DTYPES[dtype])
        return self._digests[key]

    def _server_dtype(self, url: str) -> str | None:
        """The dtype the server holds its weights in (`/server_info`'s model_config.dtype), if it is one we know."""
        if url not in self._dtypes:
            reply = http_call(url, "GET", "/server_info?config_format=json", timeout=self.timeout)
            try:
                body = reply.json() if reply.status == 200 else None
                dtype = body["vllm_config"]["model_config"]["dtype"]
            except (ValueError, KeyError, TypeError):
                dtype = None
            self._dtypes[url] = dtype if dtype in DTYPES else None
        return self._dtypes[url]

    def _tell_once(self, what: str, message: str, *args: Any) -> None:
        if what not in self._told:
            self._told.add(what)
            logger.info(message, *args)
