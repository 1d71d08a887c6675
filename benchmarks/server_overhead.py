"""What HTTP costs: the in-process embedded engine vs embedded servers driven by the vLLM client, same model.

    python -m benchmarks.server_overhead [--batches 5] [--batch 16] [--tokens 32] [--out PATH]

For each engine: startup seconds, then per batch (B trajectories, T tokens each, no EOS) the generation seconds and
the publication seconds (θ pushed and acknowledged by every replica). Prints medians and writes every sample as
JSON. One torch thread per worker or server, like the tests; on a shared 2-core machine the numbers are noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from trl_thundersync.rollout.local import LocalProcessEngine
from trl_thundersync.serve.launcher import ServerOptions, start_embedded_engine
from trl_thundersync.tiny.model import save_tiny_model
from trl_thundersync.types import RolloutRequest, SamplingParams


def _measure(engine_factory, requests, batches: int) -> dict:
    start = time.perf_counter()
    engine, model = engine_factory()
    row = {"startup_s": time.perf_counter() - start, "batch_s": [], "publish_s": []}
    try:
        for version in range(batches):
            began = time.perf_counter()
            engine.start_batch(requests, policy_version=version)
            delivered = sum(1 for _ in engine.results())
            row["batch_s"].append(time.perf_counter() - began)
            assert delivered == len(requests)
            row["publish_s"].append(engine.publish(model, version + 1))
    finally:
        engine.close()
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--out", default="outputs/server_overhead.json")
    args = parser.parse_args(argv)
    path = save_tiny_model(Path(tempfile.mkdtemp(prefix="ts-overhead-")) / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    sampling = SamplingParams(args.tokens, temperature=1.0)
    requests = [RolloutRequest(index=i, group=i // 4, seed=i,
                               prompt_ids=tuple(tokenizer(f"Question {i}: what is {i} + {i}?")["input_ids"]))
                for i in range(args.batch)]

    def model():
        return AutoModelForCausalLM.from_pretrained(path)

    def local():
        m = model()
        return LocalProcessEngine(m, sampling, max_in_flight=args.batch), m

    def servers(replicas: int):
        def factory():
            m = model()
            options = ServerOptions(max_in_flight=args.batch)
            return start_embedded_engine(m, tokenizer, sampling, replicas=replicas, options=options), m
        return factory

    engines = {"local_process": local, "embedded_server x1": servers(1), "embedded_server x2": servers(2)}
    results = {name: _measure(factory, requests, args.batches) for name, factory in engines.items()}
    print(f"{'engine':<20} {'startup s':>10} {'batch s (median)':>17} {'publish ms (median)':>20}")
    for name, row in results.items():
        print(f"{name:<20} {row['startup_s']:>10.2f} {statistics.median(row['batch_s']):>17.3f} "
              f"{1e3 * statistics.median(row['publish_s']):>20.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
