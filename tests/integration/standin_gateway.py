"""A stand-in inference gateway on loopback: one URL in front of several engines, keeping every request it
forwards. Not GKE's Gateway nor llm-d's picker: it places requests in turn (the picker's choice is what
bench/gateway_replay.py simulates); it is for a test of what the service sends to one gateway URL.

``StandInGateway(upstreams)`` serves on a free loopback port in a thread; ``.url``, ``.seen`` (method,
path, headers, parsed JSON body or None, upstream), ``.close()``.
"""

from __future__ import annotations

import http.client
import http.server
import itertools
import json
import threading
from urllib.parse import urlsplit


class StandInGateway:
    def __init__(self, upstreams: list[str]) -> None:
        self.seen: list[dict] = []
        turn = itertools.cycle(upstreams)
        lock = threading.Lock()
        gateway = self

        class Forward(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                self._forward(self.rfile.read(int(self.headers["Content-Length"])))

            def _forward(self, body: bytes | None) -> None:
                with lock:
                    upstream = next(turn)
                    gateway.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                         "body": json.loads(body) if body else None, "upstream": upstream})  # fmt: skip
                target = urlsplit(upstream)
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {"Content-Type": "application/json"} if body else {}
                connection.request(self.command, self.path, body=body, headers=headers)
                reply = connection.getresponse()
                data = reply.read()
                connection.close()
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.getheader("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet: the test reads .seen
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
