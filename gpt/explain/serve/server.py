"""gpt-explain --serve: a local page to step a GPT one training step at a time and watch it.

``make_server(session)`` is a standard-library ``ThreadingHTTPServer`` on 127.0.0.1 (a free
port unless one is asked for) around one ``gpt.explain.steps.Session``:

- ``GET /``: the page (inline CSS and script, nothing fetched from elsewhere);
- ``GET /api/state``: ``{"report": the last step's report or null, "trace": the history}``;
- ``POST /api/step`` with JSON ``{"prompt", "layer", "head", "position"}`` (all optional): one
  training step with those settings; answers like /api/state. A bad setting answers 400 with
  ``{"error": "..."}``.

The page draws what the report holds: the loss and its history, the attention heat map of the
picked block and head, the followed weights, the finite-difference checks, the predicted and
measured loss change, the embedding split, the logit lens and next token at the picked
position, and the Δloss of ablating each head. Requests from another host name are refused
(a page elsewhere cannot drive the model through DNS rebinding), bodies are capped, and one
step runs at a time. ``?autostep=N`` in the address makes the page press Step N times on load
(for screenshots and the headless-browser test).
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files

from ..steps import STEPS_LIMIT, Session

# the page (package data): HTML, CSS and its script, nothing fetched from elsewhere
PAGE = files(__package__).joinpath("page.html").read_text("utf-8")

MAX_BODY = 64 * 1024  # a prompt is cut to max_tokens anyway


class _Handler(BaseHTTPRequestHandler):
    server_version = "gpt-explain"

    def log_message(self, format, *args):
        pass  # one line per request would bury the URL printed at the start

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj, allow_nan=False).encode())

    def _local(self) -> bool:
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        if host in ("127.0.0.1", "localhost"):
            return True
        self._json(403, {"error": f"gpt-explain serves 127.0.0.1 only, not {host!r}"})
        return False

    def _state(self) -> dict:
        s = self.server.session
        return {"report": s.report, "trace": s.trace(), "source": self.server.source}

    def do_GET(self):
        if not self._local():
            return
        path = self.path.split("?", 1)[0]
        if path == "/":
            self._send(200, PAGE.encode(), "text/html; charset=utf-8")
        elif path == "/api/state":
            with self.server.lock:
                self._json(200, self._state())
        else:
            self._json(404, {"error": f"no such page: {path}"})

    def do_POST(self):
        if not self._local():
            return
        if self.path != "/api/step":
            return self._json(404, {"error": f"no such endpoint: {self.path}"})
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            return self._json(413, {"error": f"the request is {n} bytes; the limit is {MAX_BODY}"})
        try:
            req = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(req, dict):
                raise TypeError("the request must be a JSON object")
            args = {k: req.get(k) for k in ("prompt", "layer", "head", "position")}
            for k in ("layer", "head", "position"):
                if args[k] is not None:
                    args[k] = int(args[k])
            if args["prompt"] is not None and not isinstance(args["prompt"], str):
                raise TypeError("prompt must be a string")
            with self.server.lock:
                s = self.server.session
                if len(s.history) >= STEPS_LIMIT:
                    raise ValueError(f"this session has run {STEPS_LIMIT} steps, the limit")
                s.step(snapshot=False, **args)
                state = self._state()
        except (ValueError, TypeError) as e:
            return self._json(400, {"error": str(e)})
        self._json(200, state)


def make_server(session: Session, port: int = 0, source: str = "") -> ThreadingHTTPServer:
    """The server on 127.0.0.1:port (0: a free port; see ``server.server_address``)."""
    srv = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    srv.daemon_threads = True
    srv.session, srv.lock, srv.source = session, threading.Lock(), source
    return srv


def serve(model, tokenizer, prompt: str, port: int = 0, source: str = "", **session_args) -> int:
    """Serve until Ctrl-C; prints the address first."""
    session = Session(model, tokenizer, prompt, **session_args)
    srv = make_server(session, port, source)
    host, port = srv.server_address[:2]
    print(f"gpt-explain: serving {source} on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        print("gpt-explain: stopped", file=sys.stderr)
    finally:
        srv.server_close()
    return 0
