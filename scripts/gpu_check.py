"""GPU check: what the CPU suite cannot cover, run in one go on a lent GPU machine (issue 13).

    PYTHONPATH=. python scripts/gpu_check.py --out $OUT            # on the GPU machine (<= 6 min on one H200)
    PYTHONPATH=. python scripts/gpu_check.py --device cpu --quick  # every check in tiny form on the CPU (the test)

Checks (each independent: one that fails or raises does not stop the others; each is pass / fail / skipped, with
its numbers and, when skipped, the reason):
  1 grpo_exactness   ThunderSyncGRPOTrainer vs stock trl.GRPOTrainer on identical batches (benchmarks/parity.py),
                     FP32 (<= 1e-5) and bf16 autocast (<= 2x the floor: stock TRL vs itself, group members permuted)
  2 gkd_exactness    ThunderSyncGKDTrainer (local teacher, generalized JSD) vs TRL's loss on the same tokens
  3 throughput       tokens/s and peak CUDA memory of the streamed step vs stock TRL's, a random 1024x12 Qwen3, bf16;
                     ThunderSync's learner-lane time and its logged stats bound
  4 placements       FSDP2 and DeepSpeed ZeRO-2/3 at world size 1 on cuda/NCCL (torchrun --nproc_per_node 1): two
                     steps equal a plain process (<= 1e-5 FP32). Needs CUDA; two processes cannot share one GPU
                     under NCCL, so the multi-process parity stays the CPU suite's (gloo)
  5 publication      weights.policy_tensors of a bf16 LoRA policy on the device: what TRLNCCLPublisher announces and
                     streams (dtype, device, shape), values = the FP32 merge within bf16 rounding
Writes a table to stdout and JSON to `--out`/gpu_check.json (default $OUT, else the current folder). Exit status 0
when no check failed (skipped checks are reported, not failures), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout (tests/, trl_thundersync/)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check_runs as runs  # noqa: E402

# One optimizer step at ratio 1: on this batch several loss types give the same direction (measured on the CPU:
# dapo = bnpo = beta_kl = sequence-level IS = cispo, sapo = grpo), so the list keeps distinct code paths: the
# normalizers, cispo's and sapo's gates, two micro-batches with KL, two weighted rewards.
FULL_CASES = ["dapo", "grpo", "dr_grpo", "cispo", "sapo", "ga2_bnpo_beta", "multi_reward_weights_none"]
QUICK_CASES = ["dapo"]
NEEDS_GPU = {"throughput": "CUDA memory figures", "placements": "NCCL / accelerate's GPU engines",
             "publication": "the device half (bf16 on cuda)"}


def placement_worker(out: Path, model_path: str, engine: str) -> None:
    """One run (plain, or under `engine` via torchrun): saves the update θ_2 - θ_0 of the trainable parameters."""
    from transformers import AutoTokenizer

    from benchmarks.parity import (
        cpu_config,
        load_model,
        prompt_dataset,
        reward_len,
        reward_parity,
        scripted_rollout_func,
    )
    from trl_thundersync import ThunderSyncGRPOConfig, ThunderSyncGRPOTrainer

    engines = {"plain": {}, "fsdp2": dict(fsdp=True, fsdp_config={"version": 2})}
    for stage in (2, 3):
        engines[f"zero{stage}"] = dict(deepspeed={
            "zero_optimization": {"stage": stage}, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": False}})
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    initial = torch.cat([p.detach().reshape(-1) for p in load_model(model_path).parameters()])
    args = cpu_config(ThunderSyncGRPOConfig, out / engine, use_cpu=False, max_steps=2, optim="sgd",
                      learning_rate=0.05, max_grad_norm=0.5, per_device_train_batch_size=4,
                      gradient_accumulation_steps=2, **engines[engine])
    trainer = ThunderSyncGRPOTrainer(model=load_model(model_path), reward_funcs=[reward_len, reward_parity], args=args,
                                     train_dataset=prompt_dataset(16), processing_class=tokenizer,
                                     rollout_func=scripted_rollout_func(tokenizer))
    trainer.train()
    params = list(trainer.model.parameters())
    if engine == "zero3":
        import deepspeed

        with deepspeed.zero.GatheredParameters(params):
            final = torch.cat([p.detach().float().cpu().reshape(-1) for p in params])
    else:
        final = torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().cpu().reshape(-1)
                           for p in params])
    torch.save({"update": final - initial, "placement": trainer._placement.name}, out / f"{engine}.pt")
    sys.stdout.flush()
    os._exit(0)  # as the project's torchrun scripts: no interpreter / process-group teardown


def _launch(work: Path, model_path: str, engine: str, timeout: float) -> tuple[dict | None, str]:
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    script = [str(Path(__file__).resolve()), "--worker-placement", str(work), model_path, engine]
    if engine == "plain":
        cmd = [sys.executable, *script]
    else:
        from trl_thundersync.rollout.vllm_launch import free_port

        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), *script]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        return None, f"timed out after {timeout}s: {str(exc.stderr or '')[-600:]}"
    result = work / f"{engine}.pt"
    if done.returncode != 0 or not result.exists():
        return None, f"rc={done.returncode}: {(done.stderr or done.stdout)[-600:]}"
    return torch.load(result, weights_only=False), ""


def placements(work: Path, device: str) -> dict:
    """Check 4 (CUDA only): every engine's two steps vs the plain process's, relative error of the update."""
    from benchmarks.parity import relative_error

    model_path, _ = runs.tiny_paths(work)
    ref, error = _launch(work / "placements", model_path, "plain", timeout=240)
    if ref is None:
        return {"passed": False, "numbers": {"plain": error}, "detail": "the plain reference run failed"}
    if device != "cuda" or not torch.cuda.is_available():  # the harness ran (its plain reference); the engines not
        raise runs.SkippedCheck(
            "needs CUDA: accelerate enables FSDP / DeepSpeed only on GPU process groups, and NCCL needs one GPU per "
            "process (the 2-process CPU parity is the CPU suite's); the plain reference run worked "
            f"(|update| = {float(ref['update'].norm()):.3g}, {ref['placement']})")
    engines = ["fsdp2"]
    skipped = {}
    try:
        runs.require("deepspeed")
        engines += ["zero2", "zero3"]
    except runs.SkippedCheck as exc:
        skipped = {"zero2": str(exc), "zero3": str(exc)}
    rows, passed = {"skipped": skipped}, True
    for engine in engines:
        got, error = _launch(work / "placements", model_path, engine, timeout=240)
        if got is None:
            rows[engine], passed = {"error": error, "ok": False}, False
            continue
        rel = relative_error(got["update"], ref["update"])
        ok = rel <= runs.FP32_TOLERANCE and ref["update"].norm() > 0
        rows[engine] = {"rel_error_update": rel, "placement": got["placement"], "ok": ok}
        passed &= ok
    return {"passed": passed, "numbers": rows, "detail": "update theta_2 - theta_0 vs one plain process, FP32"}


def run_checks(args: argparse.Namespace, work: Path, save) -> dict:
    """Every selected check in order; `save(results)` after each (a run killed by the device's time limit still
    leaves the finished checks in the JSON). A check that would start past `--budget-s` is skipped by name."""
    cases = QUICK_CASES if args.quick else FULL_CASES
    checks = {
        "grpo_exactness": lambda: runs.grpo_exactness(work, args.device, cases),
        "gkd_exactness": lambda: runs.gkd_exactness(work, args.device),
        "throughput": lambda: runs.backward_throughput(work, args.device, args.quick),
        "placements": lambda: placements(work, args.device),
        "publication": lambda: runs.policy_publication(work, args.device),
    }
    results, began = {}, time.perf_counter()
    for name, check in checks.items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        try:
            if start - began > args.budget_s:
                raise runs.SkippedCheck(f"the run's budget of {args.budget_s}s was spent before this check began")
            result = dict(check(), status=None)
            result["status"] = "pass" if result["passed"] else "FAIL"
        except runs.SkippedCheck as exc:
            result = {"status": "skipped", "reason": str(exc)}
        except Exception as exc:  # a broken check is a failure with its traceback, the others still run
            result = {"status": "FAIL", "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()[-3000:]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        result["needs_gpu"] = NEEDS_GPU.get(name)
        results[name] = result
        print(f"[gpu_check] {name}: {result['status']} in {result['seconds']}s", flush=True)
        save(results)
    return results


def _short(value) -> str:
    text = json.dumps(value, default=lambda v: f"{v:.3g}" if isinstance(v, float) else str(v))
    return text if len(text) <= 400 else text[:400] + "..."


def report(results: dict, meta: dict) -> None:
    print(f"\nGPU check on {meta['device_name']} (device={meta['device']}, quick={meta['quick']})")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in meta["packages"].items()))
    print(f"{'check':16} {'status':8} {'sec':>6}  numbers / reason")
    for name, r in results.items():
        what = r.get("reason") or r.get("error") or _short(r.get("numbers"))
        print(f"{name:16} {r['status']:8} {r['seconds']:6.1f}  {what}")
    print("\nneed a GPU to run in full: " + ", ".join(f"{k} ({v})" for k, v in NEEDS_GPU.items()))
    for status in ("pass", "FAIL", "skipped"):
        print(f"{status}: " + (", ".join(n for n, r in results.items() if r["status"] == status) or "none"))


def _packages() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for name in ("transformers", "accelerate", "peft", "trl", "deepspeed", "vllm"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "missing"
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny form of every check (the CPU test)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for gpu_check.json")
    parser.add_argument("--only", nargs="*", help="run only these checks")
    parser.add_argument("--budget-s", type=float, default=330.0,
                        help="skip (by name) the checks that would start after this many seconds")
    parser.add_argument("--worker-placement", nargs=3, metavar=("WORK", "MODEL", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_placement:
        work, model, engine = args.worker_placement
        placement_worker(Path(work), model, engine)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    meta = {"device": args.device, "quick": args.quick, "torch": torch.__version__, "python": platform.python_version(),
            "device_name": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"}
    meta["packages"] = _packages()  # what this machine can import: the checks skip (by name) what needs the rest
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(results: dict) -> None:
        (out / "gpu_check.json").write_text(json.dumps({"meta": meta, "checks": results}, indent=2, default=str))

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        results = run_checks(args, Path(tmp), save)
    meta["seconds"] = round(time.perf_counter() - start, 1)
    save(results)
    report(results, meta)
    print(f"\nwrote {out / 'gpu_check.json'} ({meta['seconds']}s)")
    return 1 if any(r["status"] == "FAIL" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
