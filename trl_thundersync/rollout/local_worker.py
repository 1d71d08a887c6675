"""The generation loop of the embedded engine; runs in a spawned process (or a thread) — see `local.py`.

Protocol over two queues. Commands: ("submit", [(key, RolloutRequest, max_new_tokens | None), ...]),
("publish", version, extras), ("stop",). Results: ("ready", version), ("rollout", key, Rollout),
("published", version), ("error", traceback text).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import deque
from typing import Any

import torch

from ..errors import RolloutError
from ..types import Rollout, RolloutRequest, SamplingParams
from .sampling import Decoder, SamplingChain, cache_argument, sampling_chain
from .weights import FlatLayout


class _Trajectory(Decoder):
    """Decoding state of one request (cache, generator, tokens so far), with its key and token budget."""

    def __init__(self, key: Any, request: RolloutRequest, max_new_tokens: int, chain: SamplingChain) -> None:
        super().__init__(request.prompt_ids, request.seed, chain)
        self.key = key
        self.max_new_tokens = max_new_tokens
        self.request = request


def _plain_model(config) -> torch.nn.Module:
    """The worker's own whole FP32 model. In thread mode it is built in the trainer's process, where a DeepSpeed
    ZeRO-3 run has registered its config with transformers, whose `from_config` would then partition the model
    (`zero.Init`: every parameter of size 0 here); the registration is set aside while the model is built (the
    trainer's thread is waiting for this worker to be ready)."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations import deepspeed as hf_deepspeed

    registered = hf_deepspeed._hf_deepspeed_config_weak_ref
    if registered is None or not hf_deepspeed.is_deepspeed_zero3_enabled():
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    hf_deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = registered


class _Worker:
    """The generation loop; identical in a spawned process and in a thread."""

    def __init__(self, config, layout: FlatLayout, buf, sampling: SamplingParams, max_in_flight, commands, results):
        self.model = _plain_model(config).eval()
        self.params = self.model.state_dict()
        floats = {n for n, t in self.params.items() if t.is_floating_point()}
        unknown = sorted(floats ^ {name for name, _, _ in layout.entries})
        if unknown:
            raise RolloutError(f"policy weights and the worker model disagree on tensor names: {unknown[:5]}")
        self.cache_kwarg = cache_argument(self.model)
        self.layout, self.buf, self.sampling = layout, buf, sampling
        self.chain = sampling_chain(sampling)  # temperature > 0 here (LocalProcessEngine refuses 0)
        self.eos = frozenset(sampling.eos_token_ids)
        self.max_in_flight, self.commands, self.results = max_in_flight, commands, results
        self.version = -1  # set by the first load
        self.pending: deque[tuple[Any, RolloutRequest, int | None]] = deque()  # (key, request, max_new_tokens)
        self.active: list[_Trajectory] = []

    def load(self, version: int, extras: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in [*self.layout.views(self.buf), *extras.items()]:
                self.params[name].copy_(tensor)
            # Tied parameters share storage: two different published values for them cannot both be served.
            for name, tensor in self.layout.views(self.buf):
                if not torch.equal(self.params[name], tensor):
                    raise RolloutError(f"tensor {name!r} could not be loaded as published (tied to another tensor?)")
        self.version = version

    def run(self, alive) -> None:
        while True:
            busy = bool(self.active or self.pending)
            try:
                command = self.commands.get_nowait() if busy else self.commands.get(timeout=1.0)
            except queue.Empty:
                command = None
            if command is None:
                if busy:
                    self.tick()
                elif not alive():
                    return
            elif command[0] == "stop":
                return
            elif command[0] == "submit":
                self.pending.extend(command[1])
            elif command[0] == "publish":
                self.load(command[1], command[2])
                self.results.put(("published", command[1]))

    def tick(self) -> None:
        while self.pending and len(self.active) < self.max_in_flight:
            key, request, max_new = self.pending.popleft()
            self.active.append(_Trajectory(key, request, max_new or self.sampling.max_new_tokens, self.chain))
        still: list[_Trajectory] = []
        for traj in self.active:
            if self.step(traj):
                self.results.put(("rollout", traj.key, self.finish(traj)))
            else:
                still.append(traj)
        self.active = still

    def step(self, traj: _Trajectory) -> bool:
        """Sample one token for `traj`; True when the trajectory is finished."""
        token, _ = traj.step(self.model, self.cache_kwarg)
        return token in self.eos or traj.num_new >= traj.max_new_tokens

    def finish(self, traj: _Trajectory) -> Rollout:
        req = traj.request
        return Rollout(
            index=req.index,
            group=req.group,
            policy_version=self.version,
            prompt_ids=tuple(req.prompt_ids),
            completion_ids=traj.completion_ids,
            sampling_logprobs=tuple(traj.logprobs),
            started_at=traj.started,  # time.monotonic(); mapped to the parent's perf_counter on receipt
            finished_at=time.monotonic(),
        )


def _worker_main(config, layout, buf, extras, sampling, max_in_flight, commands, results, version, num_threads):
    """Worker entry (process or thread): reports ("ready", v), then serves; ("error", traceback) on any failure."""
    try:
        if num_threads is not None:  # process mode only: thread mode must not change the learner's settings
            torch.set_num_threads(num_threads)
        worker = _Worker(config, layout, buf, sampling, max_in_flight, commands, results)
        worker.load(version, extras)
        results.put(("ready", version))
        if num_threads is None:
            worker.run(alive=threading.main_thread().is_alive)
        else:
            import multiprocessing

            parent = multiprocessing.parent_process()
            worker.run(alive=lambda: parent is None or parent.is_alive())
    except BaseException:  # the parent raises RolloutError with this text
        results.put(("error", traceback.format_exc()))
