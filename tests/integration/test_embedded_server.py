"""The embedded rollout server over real HTTP: two replicas in subprocesses on loopback, driven by VLLMServerEngine.

Every server runs with one torch thread, like the in-process LocalProcessEngine the results are compared with, so
both run the same kernels and the same seed must give bit-identical tokens and log-probs.
"""

from __future__ import annotations

import copy
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trl_thundersync.errors import RolloutError, StalePolicyError
from trl_thundersync.rollout.local import LocalProcessEngine
from trl_thundersync.rollout.vllm_api import POLICY_VERSION_HEADER
from trl_thundersync.rollout.vllm_client import VLLMServerEngine
from trl_thundersync.rollout.weights import policy_state_dict
from trl_thundersync.types import RolloutRequest, SamplingParams

N = 8
MAX_NEW = 24
TEMPERATURE = 0.7
PROMPTS = ("2 + 3 = ", "Count the letters in", "def add(a, b):", "The quick brown fox")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `python -m trl_thundersync.serve` subprocess on a fixed loopback port (kept across restarts)."""

    def __init__(self, model_path: str, log_dir: Path, name: str) -> None:
        self.model_path, self.port = model_path, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Server:
        command = [sys.executable, "-m", "trl_thundersync.serve", "--model", self.model_path, "--port",
                   str(self.port), "--num-threads", "1", "--max-in-flight", str(N), "--log-level", "warning"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"server exited early:\n{self.log.read_text()[-3000:]}"
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.url} not ready:\n{self.log.read_text()[-3000:]}")

    def version(self) -> int:
        with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
            return int(reply.headers[POLICY_VERSION_HEADER])

    def post(self, path: str, payload: dict) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read() or b"null")

    def models(self) -> list[str]:
        with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as reply:
            return [card["id"] for card in json.loads(reply.read())["data"]]

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def replicas(tiny_model_path, tmp_path_factory, request):
    log_dir = tmp_path_factory.mktemp("servers")
    servers = [Server(tiny_model_path, log_dir, name) for name in ("a", "b")]
    request.addfinalizer(lambda: [s.kill() for s in servers])  # registered before starting: never leaked
    for server in servers:
        server.start()
    for server in servers:
        server.wait_ready()
    return servers


@pytest.fixture(scope="module")
def base(tiny_model_path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()


@pytest.fixture(scope="module")
def base_file(base, tmp_path_factory):
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("weights") / "base.safetensors"
    save_file(policy_state_dict(base), str(path))
    return str(path)


def _perturbed(model, seed: int, scale: float = 0.5):
    changed = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator))
    return changed


def _requests(tokenizer, n: int = N):
    return [RolloutRequest(index=i, group=i // 2, prompt_ids=tuple(tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"]),
                           seed=1000 + i) for i in range(n)]


def _local(model, sampling, requests) -> dict:
    engine = LocalProcessEngine(model, sampling, mode="thread", max_in_flight=len(requests))
    try:
        engine.start_batch(requests, policy_version=0)
        return {r.index: r for r in engine.results()}
    finally:
        engine.close()


def _run(engine, requests, version) -> list:
    engine.start_batch(requests, policy_version=version)
    return list(engine.results())


def _engine(servers, base_file, tokenizer, sampling, **kwargs) -> VLLMServerEngine:
    """An engine over `servers`, after putting the base weights on all of them under one fresh version."""
    for server in servers:
        if server.process.poll() is not None:
            server.start().wait_ready()
    version = max(s.version() for s in servers) + 1
    for server in servers:
        assert server.post("/thundersync/update_weights", {"path": base_file, "policy_version": version}) \
            ["policy_version"] == version
        if kwargs.get("publisher") == "lora":  # the weights it started with again: the label a LoRA run expects
            server.post("/update_weight_version", {"new_version": "default"})
    return VLLMServerEngine([s.url for s in servers], tokenizer, sampling, policy_version=version, **kwargs)


@pytest.fixture(scope="module")
def sampling(base, tokenizer):
    """EOS ids picked from EOS-free completions, so that trajectories end early at known, varied lengths."""
    full = _local(base, SamplingParams(MAX_NEW, temperature=TEMPERATURE), _requests(tokenizer))
    eos = {full[N - 1].completion_ids[1], full[N - 3].completion_ids[6], full[0].completion_ids[12]}
    return SamplingParams(MAX_NEW, temperature=TEMPERATURE, eos_token_ids=tuple(sorted(eos)))


def test_unreachable_url_fails_at_startup_naming_it(sampling):
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(RolloutError, match=f"{url} is not reachable"):
        VLLMServerEngine([url], None, sampling, startup_timeout=0.5)


def test_results_stream_in_completion_order_with_the_local_engine_samples(replicas, base, base_file, tokenizer,
                                                                          sampling):
    requests = _requests(tokenizer)
    expected = _local(base, sampling, requests)
    engine = _engine(replicas[:1], base_file, tokenizer, sampling)
    try:
        rollouts = _run(engine, requests, engine.policy_version)
        stats = engine.stats()
    finally:
        engine.close()
    assert sorted(r.index for r in rollouts) == list(range(N))
    for r in rollouts:
        assert r.policy_version == engine.policy_version
        assert r.completion_ids == expected[r.index].completion_ids
        assert r.sampling_logprobs == expected[r.index].sampling_logprobs  # bit-identical through JSON
    lengths = [len(r.completion_ids) for r in rollouts]
    assert len(set(lengths)) > 2 and lengths != [len(expected[i].completion_ids) for i in range(N)]
    # One server decodes all N round-robin, one token per tick: a result is handed on when it ends. A request sent
    # no later than another and 3+ tokens shorter ends ≥ 3 ticks earlier, well beyond HTTP jitter. (Only such pairs:
    # on a loaded machine the client's sends are staggered, and a long request sent early may rightly end first.)
    for a in range(N):
        for b in range(a + 1, N):
            if rollouts[b].started_at <= rollouts[a].started_at:
                assert lengths[a] < lengths[b] + 3, f"result {a} (length {lengths[a]}) came before {b} ({lengths[b]})"
    assert all(x.finished_at <= y.finished_at for x, y in zip(rollouts, rollouts[1:], strict=False))
    assert stats.time_to_first_result < rollouts[-1].finished_at - rollouts[0].started_at
    assert stats.trajectories == N and stats.in_flight == 0 and stats.tokens == sum(lengths)


def test_publication_is_acknowledged_by_both_replicas_and_changes_generation(replicas, base, base_file, tokenizer,
                                                                             sampling):
    requests = _requests(tokenizer)
    changed = _perturbed(base, seed=1)
    expected = _local(changed, sampling, requests)
    engine = _engine(replicas, base_file, tokenizer, sampling)
    try:
        before = {r.index: r.completion_ids for r in _run(engine, requests, engine.policy_version)}
        version = engine.policy_version + 1
        seconds = engine.publish(changed, policy_version=version)
        assert [s.version() for s in replicas] == [version, version]  # both swapped before publish() returned
        stats = engine.stats()
        assert [r.policy_version for r in stats.replicas] == [version, version]
        assert stats.publications == 1 and stats.last_publication_seconds == seconds > 0
        with pytest.raises(RolloutError, match=f"serve version {version}"):
            engine.start_batch(requests, policy_version=version - 1)
        after = _run(engine, requests, version)
        stats = engine.stats()
    finally:
        engine.close()
    assert {r.policy_version for r in after} == {version}
    assert {r.index: r.completion_ids for r in after} == {i: r.completion_ids for i, r in expected.items()} != before
    assert all(r.requests == N and r.tokens_per_second > 0 for r in stats.replicas)  # N per replica over 2 batches


def test_a_result_with_a_stale_version_is_refused(replicas, base_file, tokenizer, sampling):
    engine = _engine(replicas, base_file, tokenizer, sampling)
    try:
        # Someone else loads a version on replica b behind the engine's back: its samples must not be accepted.
        replicas[1].post("/thundersync/update_weights", {"path": base_file, "policy_version": 10_000})
        with pytest.raises(StalePolicyError, match=f"{replicas[1].url} sampled it with policy version 10000"):
            _run(engine, _requests(tokenizer, 4), engine.policy_version)
    finally:
        engine.close()


def test_a_replica_killed_mid_batch_is_retried_after_its_restart(replicas, base, base_file, tokenizer):
    long = SamplingParams(300, temperature=TEMPERATURE)  # no EOS: ~1 s of decoding per replica
    requests = _requests(tokenizer)
    changed = _perturbed(base, seed=2)
    expected = _local(changed, long, requests)
    engine = _engine(replicas, base_file, tokenizer, long, restart_timeout=90.0)
    try:
        version = engine.policy_version + 1
        engine.publish(changed, policy_version=version)
        engine.start_batch(requests, policy_version=version)
        time.sleep(0.3)
        replicas[1].kill()  # restarted below from the model folder: it comes back at version 0, without θ
        replicas[1].start()
        rollouts = list(engine.results())
        stats = engine.stats()
    finally:
        engine.close()
    assert stats.replicas[1].retries >= 1 and stats.replicas[1].alive
    assert replicas[1].version() == version  # the engine re-published the version after the restart
    assert {r.policy_version for r in rollouts} == {version}
    assert {r.index: r.completion_ids for r in rollouts} == {i: r.completion_ids for i, r in expected.items()}


def test_lora_publication_serves_each_adapter_version(replicas, tiny_model_path, base, base_file, tokenizer, sampling):
    from peft import LoraConfig, get_peft_model

    requests = _requests(tokenizer)
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    base_samples = {i: r.completion_ids for i, r in _local(base, sampling, requests).items()}
    engine = _engine(replicas, base_file, tokenizer, sampling, publisher="lora")
    try:
        engine.publish(policy, policy_version=1)  # lora_B = 0: the adapter leaves the model unchanged
        prefix = engine._publisher.prefix  # policy-<run id>: names unique per run
        assert prefix.startswith("policy-") and all(f"{prefix}-v1" in s.models() for s in replicas)
        first = _run(engine, requests, 1)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(3)
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=generator))
        expected = _local(policy, sampling, requests)  # LocalProcessEngine merges the adapter: W + BA·α/r
        engine.publish(policy, policy_version=2)
        assert all(f"{prefix}-v2" in s.models() and f"{prefix}-v1" not in s.models() for s in replicas)
        second = _run(engine, requests, 2)
    finally:
        engine.close()
    assert all(not any(m.startswith(prefix) for m in s.models()) for s in replicas)  # the last one unloaded at close
    assert {r.policy_version for r in first} == {1} and {r.policy_version for r in second} == {2}
    assert {r.index: r.completion_ids for r in first} == base_samples
    assert {r.index: r.completion_ids for r in second} == {i: r.completion_ids for i, r in expected.items()}
    assert {r.index: r.completion_ids for r in second} != base_samples


def test_a_replica_that_dies_for_good_fails_the_batch_loudly(replicas, base_file, tokenizer):
    long = SamplingParams(300, temperature=TEMPERATURE)
    engine = _engine(replicas, base_file, tokenizer, long, restart_timeout=1.0)
    try:
        engine.start_batch(_requests(tokenizer), policy_version=engine.policy_version)
        time.sleep(0.3)
        replicas[1].kill()
        with pytest.raises(RolloutError, match=f"{replicas[1].url} failed .* did not come back"):
            list(engine.results())
        with pytest.raises(RolloutError, match="failed earlier"):
            engine.start_batch(_requests(tokenizer), policy_version=engine.policy_version)
        assert not engine.stats().replicas[1].alive
    finally:
        engine.close()


def test_a_request_over_its_timeout_fails_the_batch_naming_the_limit(replicas, base_file, tokenizer):
    long = SamplingParams(300, temperature=TEMPERATURE)  # far longer than the 10 ms allowed
    engine = _engine(replicas[:1], base_file, tokenizer, long, request_timeout=0.01)
    try:
        engine.start_batch(_requests(tokenizer, 2), policy_version=engine.policy_version)
        with pytest.raises(RolloutError, match=f"no answer from {replicas[0].url} within 0.01 s"):
            list(engine.results())
    finally:
        engine.close()


def test_sigterm_stops_a_server_cleanly(replicas):
    server = replicas[0]
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=15) == 0
