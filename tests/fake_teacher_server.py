"""A small vLLM-compatible teacher server for tests: `/v1/models` and `/v1/completions` with `prompt_logprobs`,
answered by a causal LM held in memory (so its scores can be compared with a `LocalTeacher`'s), and recording every
request body. The contract tests use the embedded server (`trl_thundersync.serve`, which answers `prompt_logprobs`
as vLLM does); this fake stays for tests that serve a model they never save (a relabelled vocabulary) or count the
requests. Misbehaviours on request: `drop_last` returns one log-probability too few, `nan` returns NaN scores."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


class FakeTeacherServer:
    def __init__(self, model, name: str = "tiny-teacher", *, drop_last: bool = False, nan: bool = False) -> None:
        self.model, self.name, self.drop_last, self.nan = model, name, drop_last, nan
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                return None

            def do_GET(self) -> None:
                self._reply({"object": "list", "data": [{"id": server.name, "object": "model"}]})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                self._reply(server.complete(body))

            def _reply(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @torch.no_grad()
    def complete(self, body: dict) -> dict:
        ids = body["prompt"]
        logps = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        entries: list = [None]
        for position in range(1, len(ids)):
            value = float("nan") if self.nan else float(logps[position - 1, ids[position]])
            entries.append({str(ids[position]): {"logprob": value, "rank": 1, "decoded_token": ""}})
        if self.drop_last:
            entries = entries[:-1]
        return {"id": "cmpl-fake", "object": "text_completion", "model": self.name,
                "choices": [{"index": 0, "text": "", "prompt_logprobs": entries, "finish_reason": "length"}]}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
