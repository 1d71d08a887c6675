"""Start the embedded rollout server: `python -m trl_thundersync.serve --model PATH --port N`.

    python -m trl_thundersync.serve --model ./tiny-qwen3 --port 8000 --max-in-flight 16 --num-threads 4

Prints one line `thundersync-serve: ... on http://HOST:PORT` once the model is loaded and the port is bound
(`--port 0` picks a free port). SIGTERM or Ctrl-C stop it cleanly: requests still running are answered with 503.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from .app import EmbeddedServer, make_http_server

logger = logging.getLogger("trl_thundersync.serve")


def _watch_parent(parent: int, server) -> None:
    """Shut the server down once its parent is gone (the child is re-parented: getppid() changes)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    logger.warning("parent process %d exited: shutting down", parent)
    server.shutdown()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m trl_thundersync.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="Hugging Face model folder (weights, config, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind; 0 picks a free one")
    parser.add_argument("--served-model-name", default=None, help="name in /v1/models (default: the --model value)")
    parser.add_argument("--max-in-flight", type=int, default=16, help="requests decoded concurrently; more queue")
    parser.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--max-logprobs", type=int, default=-1,
                        help="most (prompt) log-probs per position a request may ask for, as vLLM's flag; -1 (the "
                             "default here; vLLM's is 20) = the whole vocabulary")
    parser.add_argument("--policy-version", type=int, default=0, help="version the weights at --model represent")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="stop when the process that started this server exits (used by the trainer)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_in_flight < 1 or args.policy_version < 0 or args.max_logprobs < -1:
        print("--max-in-flight must be >= 1, --policy-version >= 0 and --max-logprobs >= -1", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s thundersync-serve %(levelname)s %(message)s")
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    app = EmbeddedServer(args.model, served_name=args.served_model_name, max_in_flight=args.max_in_flight,
                         policy_version=args.policy_version, max_logprobs=args.max_logprobs)
    server = make_http_server(app, args.host, args.port)

    def stop(signum: int, _frame) -> None:
        logger.info("signal %d: shutting down", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()  # shutdown() waits for serve_forever

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.exit_with_parent:
        threading.Thread(target=_watch_parent, args=(os.getppid(), server), daemon=True).start()
    host, port = server.server_address[:2]
    print(f"thundersync-serve: {app.served.name!r} at policy version {app.version} on http://{host}:{port}",
          flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        app.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
