"""A stand-in vLLM server on loopback: the subset of vLLM's OpenAI API the ``vllm`` engine uses.

``GET /v1/models`` lists one model whose ``root`` is a prepared model folder (the engine loads the
tokenizer from it); ``POST /v1/completions`` answers as vLLM does for one output token with log-probs
(``tests/readers/support.completion_reply``: exact reads of ``logprob_token_ids``, no masked reads).
No model runs: it is for what a test of the service's process needs, not for probabilities.

    python -m tests.integration.standin_vllm PORT MODEL_FOLDER
"""

from __future__ import annotations

import http.server
import json
import sys

from tests.readers.support import completion_reply

SERVED_NAME = "stand-in"


def handler(root: str) -> type[http.server.BaseHTTPRequestHandler]:
    class StandIn(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/v1/models":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            self._send(200, {"data": [{"id": SERVED_NAME, "root": root, "max_model_len": 8192}]})

        def do_POST(self):
            if self.path != "/v1/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._send(200, completion_reply(body))

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # quiet: the test reads the service's log, not this one's
            pass

    return StandIn


if __name__ == "__main__":
    port, root = int(sys.argv[1]), sys.argv[2]
    http.server.ThreadingHTTPServer(("127.0.0.1", port), handler(root)).serve_forever()
