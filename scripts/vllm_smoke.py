"""Smoke test of a rollout server for GPU users: one batch, one full-weight publication, one LoRA load, versions and
timings. Run it before a long job, on the trainer's machine, against the servers the job will use.

    # a running `vllm serve` (see the README for the exact commands and the ports that must be reachable)
    python scripts/vllm_smoke.py --model Qwen/Qwen3-0.6B --url http://gpu-node:8000 [--lora-url http://gpu-node:8001]
    # start `vllm serve` here (GPU machine): the rollout server, with --enable-lora when --lora is given
    python scripts/vllm_smoke.py --model Qwen/Qwen3-0.6B --serve --port 8000 --lora --device cuda
    # the embedded server (CPU; what the package's own tests run)
    python scripts/vllm_smoke.py --model path/to/tiny --embedded --lora

Steps, each timed: connect (`VLLMServerEngine`: health, /v1/models, tokenizer probe, /server_info limits, log-prob
mode), a batch of `--prompts` samples at version 0, a full-weight publication of the policy as version 1 (NCCL to
vLLM, a weight file to the embedded server) and a batch that must come back at version 1, then (with `--lora` or
`--lora-url`) a LoRA adapter of the policy published as version 1 to the LoRA server and a batch through it. The
version each sample reports is checked (the embedded server's header, the adapter name vLLM echoes); the version the
server itself confirms is read from `GET /weight_info` (vLLM >= 0.27 in dev mode) and printed, or reported as not
available. The last line is a JSON summary; the exit code is 0 when every check passed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Count: 1, 2, 3,"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the policy checkpoint (the servers must serve the same one)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running rollout server, e.g. http://gpu-node:8000")
    where.add_argument("--serve", action="store_true", help="start `vllm serve --model` here (needs vLLM and a GPU)")
    where.add_argument("--embedded", action="store_true", help="start the embedded server here (CPU)")
    parser.add_argument("--lora", action="store_true", help="also publish a LoRA adapter (to --url or the started "
                        "server: it needs --enable-lora, which --serve adds)")
    parser.add_argument("--lora-url", help="the LoRA rollout server, if it is not --url (implies --lora)")
    parser.add_argument("--adapter-dir", help="a folder the LoRA server can read at the same path (a shared "
                        "filesystem), where adapters are written; default: the trainer's temp folder")
    parser.add_argument("--port", type=int, default=8000, help="--serve: the port of the started vllm serve")
    parser.add_argument("--group-port", type=int, default=51216, help="NCCL rendezvous port (TRL's vllm_group_port)")
    parser.add_argument("--device", default="cpu", help="the policy's device for the NCCL publication (cuda)")
    parser.add_argument("--prompts", type=int, default=8, help="samples per batch")
    parser.add_argument("--max-tokens", type=int, default=32, help="new tokens per sample")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for a server to come up")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.max_tokens < 1:
        parser.error(f"--prompts={args.prompts} and --max-tokens={args.max_tokens} must be >= 1")
    if args.url is not None:
        from trl_thundersync.errors import ConfigurationError
        from trl_thundersync.rollout.vllm_api import check_base_url

        try:
            for name in ("url", "lora_url"):
                if getattr(args, name) is not None:
                    setattr(args, name, check_base_url(getattr(args, name), f"--{name.replace('_', '-')}"))
        except ConfigurationError as exc:
            parser.error(str(exc))
    args.lora = args.lora or args.lora_url is not None
    return args


def package_versions() -> dict[str, str | None]:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "trl", "peft", "trl-thundersync", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def vllm_serve_env(*, lora: bool) -> dict[str, str]:
    """The environment `vllm serve` needs: dev mode (/server_info, /reset_prefix_cache, the weight-transfer and
    version routes) and, for LoRA, runtime adapter loading (/v1/load_lora_adapter answers 404 without it)."""
    return {"VLLM_SERVER_DEV_MODE": "1", **({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if lora else {})}


def vllm_serve_command(model: str, port: int, *, lora: bool) -> list[str]:
    """`vllm serve` as a rollout server for this package (TRL 1.16's `trl vllm-serve` flags): processed log-probs
    (the importance-sampling correction), NCCL weight transfer (TRL's client), LoRA adapters when asked."""
    command = ["vllm", "serve", model, "--host", "0.0.0.0", "--port", str(port),
               "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
               "--weight-transfer-config", '{"backend": "nccl"}']
    return command + (["--enable-lora", "--max-lora-rank", "64"] if lora else [])


class Timer:
    """Named wall-clock spans, in order."""

    def __init__(self) -> None:
        self.spans: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.spans[name] = round(time.perf_counter() - start, 3)
            print(f"  {name}: {self.spans[name]:.3f} s", flush=True)


def run_batch(engine: Any, tokenizer: Any, prompts: int, version: int) -> dict[str, Any]:
    """One logical batch of `prompts` samples at `version`; the versions the samples report, and their tokens."""
    from trl_thundersync.types import RolloutRequest

    ids = tuple(tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"])
    engine.start_batch([RolloutRequest(index=i, group=i, prompt_ids=ids, seed=1000 + i) for i in range(prompts)],
                       policy_version=version)
    rollouts = list(engine.results())
    return {"samples": len(rollouts), "tokens": sum(len(r.completion_ids) for r in rollouts),
            "versions": sorted({r.policy_version for r in rollouts})}


def confirmed_version(url: str) -> str | None:
    """The weight version the server itself reports (`GET /weight_info`, vLLM >= 0.27 dev mode), None if absent."""
    from trl_thundersync.rollout.vllm_api import http_call

    reply = http_call(url, "GET", "/weight_info", timeout=30.0)
    body = reply.json() if reply.status == 200 else None
    value = body.get("weight_version") if isinstance(body, dict) else None
    return None if value is None else str(value)


def start_server(args: argparse.Namespace, policy: Any, tokenizer: Any, stack: list) -> str:
    """`--serve`: vllm serve as a child process; `--embedded`: the embedded server; returns its URL."""
    from trl_thundersync.rollout.vllm_replicas import await_health

    if args.embedded:
        from trl_thundersync.serve.launcher import EmbeddedServers, ServerOptions

        servers = EmbeddedServers.start(policy, tokenizer, replicas=1, policy_version=0,
                                        options=ServerOptions(startup_timeout=args.startup_timeout))
        stack.append(servers.close)
        return servers.urls[0]
    command, env = vllm_serve_command(args.model, args.port, lora=args.lora), vllm_serve_env(lora=args.lora)
    print("starting: " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(command), flush=True)
    process = subprocess.Popen(command, env={**os.environ, **env})
    stack.append(lambda: (process.terminate(), process.wait(timeout=60)))
    url = f"http://127.0.0.1:{args.port}"
    await_health(url, args.startup_timeout, exited=lambda: None if process.poll() is None else
                 f"exited with code {process.returncode}")
    return url


def check(summary: dict[str, Any], name: str, ok: bool, detail: str) -> None:
    summary["checks"][name] = ok
    print(f"  [{'ok' if ok else 'FAILED'}] {name}: {detail}", flush=True)


def full_weights(args, url: str, policy, tokenizer, sampling, timer: Timer, summary: dict) -> None:
    """Batch at version 0, publish version 1, batch at version 1; the versions checked."""
    from trl_thundersync.rollout.vllm_client import VLLMServerEngine

    engine = timer.run("connect", VLLMServerEngine, [url], tokenizer, sampling, startup_timeout=args.startup_timeout,
                       nccl_options={"device": args.device, "group_port": args.group_port})
    try:
        limits = engine.server_limits[0]
        summary["server"] = {"release": limits.release, "logprobs_mode": limits.logprobs_mode,
                             "max_num_seqs": limits.max_num_seqs, "max_concurrency": engine.max_concurrency,
                             "max_model_len": engine.max_model_len}
        print(f"  server: {summary['server']}", flush=True)
        first = timer.run("batch_v0", run_batch, engine, tokenizer, args.prompts, 0)
        check(summary, "batch_v0", first["versions"] == [0] and first["samples"] == args.prompts, str(first))
        timer.run("publish_full_v1", engine.publish, policy, 1)
        second = timer.run("batch_v1", run_batch, engine, tokenizer, args.prompts, 1)
        check(summary, "batch_v1", second["versions"] == [1], str(second))
        summary["tokens_per_second"] = round(second["tokens"] / max(timer.spans["batch_v1"], 1e-9), 1)
        confirmed = confirmed_version(url)
        summary["server_confirmed_version"] = confirmed
        if confirmed is None:
            print("  server-confirmed version: not available (GET /weight_info: vLLM >= 0.27 with "
                  "VLLM_SERVER_DEV_MODE=1; the embedded server reports its version on every answer instead)")
        else:
            check(summary, "server_confirmed_version", confirmed.endswith("-v1"), f"/weight_info says {confirmed!r}")
    finally:
        engine.close()


def lora_adapter(args, url: str, policy, tokenizer, sampling, timer: Timer, summary: dict) -> None:
    """A LoRA adapter of the policy published as version 1 (vLLM loads it from disk) and a batch through it."""
    from peft import LoraConfig, get_peft_model

    from trl_thundersync.rollout.vllm_client import VLLMServerEngine
    from trl_thundersync.rollout.vllm_publish import LoRAAdapterPublisher

    peft_model = get_peft_model(policy, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    # --adapter-dir: the folder the server reads adapters from (the trainer's `vllm_publish_dir`)
    options = {} if args.adapter_dir is None else {"directory": args.adapter_dir}
    engine = timer.run("lora_connect", VLLMServerEngine, [url], tokenizer, sampling,
                       publisher=LoRAAdapterPublisher(**options), startup_timeout=args.startup_timeout)
    try:
        timer.run("publish_lora_v1", engine.publish, peft_model, 1)
        batch = timer.run("lora_batch_v1", run_batch, engine, tokenizer, args.prompts, 1)
        check(summary, "lora_batch_v1", batch["versions"] == [1], str(batch))
    finally:
        engine.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_thundersync.types import SamplingParams

    summary: dict[str, Any] = {"versions": package_versions(), "checks": {}}
    print("versions: " + ", ".join(f"{k} {v}" for k, v in summary["versions"].items()), flush=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device)
    eos = tokenizer.eos_token_id
    sampling = SamplingParams(max_new_tokens=args.max_tokens, eos_token_ids=() if eos is None else (int(eos),))
    timer, stack = Timer(), []
    try:
        url = args.url or timer.run("start_server", start_server, args, policy, tokenizer, stack)
        full_weights(args, url, policy, tokenizer, sampling, timer, summary)
        if args.lora:
            lora_adapter(args, args.lora_url or url, policy, tokenizer, sampling, timer, summary)
    finally:
        for close in reversed(stack):
            close()
    summary["seconds"] = timer.spans
    ok = bool(summary["checks"]) and all(summary["checks"].values())
    summary["ok"] = ok
    print(json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
