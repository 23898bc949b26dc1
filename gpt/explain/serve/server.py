"""gpt-explain --serve: a local page to step a GPT one training step at a time and watch it.

``make_server(session)`` is a ``gpt.explain.serve.calm.CalmServer`` on 127.0.0.1 (a free port
unless one is asked for) around one ``gpt.explain.steps.Session``:

- ``GET /``: the page (inline CSS and script, nothing fetched from elsewhere);
- ``GET /api/state``: ``{"report": the last step's report or null, "trace": the history,
  "story": the report's stage diagram as an HTML fragment (gpt.explain.render.story, the same
  drawing as ``gpt-explain --format html``; every report string escaped, no script) or null}``;
- ``POST /api/step`` with JSON ``{"prompt", "layer", "head", "position"}`` (all optional): one
  training step with those settings; answers like /api/state. A bad setting answers 400 with
  ``{"error": "..."}``.
- ``POST /api/reset`` with JSON ``{"prompt"}`` (optional): the model's weights as they were at
  the start, no history, and that prompt; answers like /api/state.

The page leads with the story of the last step (the stage diagram forward and backward, AdamW,
the evidence, before and after), then draws what the report holds across steps: the loss and its history, the attention heat map of the
picked block and head, the followed weights, the finite-difference checks, the predicted and
measured loss change, the embedding split, the logit lens and next token at the picked
position, and the Δloss of ablating each head. Loading the page never steps: the session
persists across loads until Reset. ``?autostep=N`` in the address makes the page step until
the session has run N steps (for screenshots and the headless-browser test; a reload adds
none). What a request must be (host, origin, JSON, size) is ``gpt.explain.serve.calm``'s; one step
runs at a time.
"""

from __future__ import annotations

import sys
import threading
from importlib.resources import files

from ..render.story import render_story
from ..steps import STEPS_LIMIT, Session
from .calm import MAX_CONNECTIONS, REQUEST_TIMEOUT, CalmHandler, CalmServer, step_args
from .restart import Restart

# the page (package data): HTML, CSS and its script, nothing fetched from elsewhere
PAGE = files(__package__).joinpath("page.html").read_text("utf-8")


class _Handler(CalmHandler):
    def _state(self) -> dict:
        s = self.server.session
        story = None if s.report is None else render_story(s.report)  # escaped, no script
        return {
            "report": s.report,
            "trace": s.trace(),
            "source": self.server.source,
            "story": story,
        }

    def get(self, path: str):
        if path == "/":
            return 200, PAGE.encode()
        if path == "/api/state":
            with self.server.lock:
                return 200, self._state()
        return super().get(path)

    def post(self, path: str, request: dict):
        if path not in ("/api/step", "/api/reset"):
            return super().post(path, request)
        args = step_args(request)
        with self.server.lock:
            s = self.server.session
            try:
                if path == "/api/reset":
                    self.server.session = self.server.restart(args["prompt"])
                elif len(s.history) >= STEPS_LIMIT:
                    raise ValueError(f"this session has run {STEPS_LIMIT} steps, the limit: Reset")
                else:
                    s.step(snapshot=False, **args)
            except (ValueError, TypeError) as e:
                return 400, {"error": str(e)}
            return 200, self._state()


def make_server(
    session: Session,
    port: int = 0,
    source: str = "",
    host: str = "127.0.0.1",
    max_connections: int = MAX_CONNECTIONS,
    timeout: float = REQUEST_TIMEOUT,
) -> CalmServer:
    """The server on host:port (0: a free port; see ``server.server_address``)."""
    srv = CalmServer((host, port), _Handler, max_connections, timeout)
    srv.session, srv.lock, srv.source = session, threading.Lock(), source
    srv.restart = Restart(session)
    return srv


def serve(
    model, tokenizer, prompt: str, port: int = 0, source: str = "", host: str = "127.0.0.1", **kw
) -> int:
    """Serve until Ctrl-C; prints the address first."""
    session = Session(model, tokenizer, prompt, **kw)
    srv = make_server(session, port, source, host)
    host, port = srv.server_address[:2]
    host = f"[{host}]" if ":" in host else host
    print(f"gpt-explain: serving {source} on http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        print("gpt-explain: stopped", file=sys.stderr)
    finally:
        srv.server_close()
    return 0
