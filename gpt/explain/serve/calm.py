"""The calm side of ``gpt-explain --serve``: what a request must be before the session sees it.

Every refusal is one line of JSON, ``{"error": "..."}``, with a 4xx status, and nothing is
printed. ``CalmHandler`` checks, in this order:

- the Host header names this server (loopback, or the address asked for with --allow-remote),
  so that a page elsewhere cannot reach the model through DNS rebinding (403);
- a POST comes from the page's own origin: an ``Origin`` header, when the browser sends one,
  is ``http://`` + the Host header, and ``Sec-Fetch-Site`` is same-origin (403);
- a POST says ``Content-Type: application/json`` (415). A web page can send a cross-site form
  or a ``text/plain`` POST without asking anyone; an ``application/json`` one needs the
  server's consent (a CORS preflight), which this server never gives;
- ``Content-Length`` is present (411), decimal (400) and at most ``MAX_BODY`` (413), and the
  body arrives in time (408): the whole request, headers and body, must arrive within
  ``REQUEST_TIMEOUT`` of the connection (a client still sending headers then is dropped), so
  that clients trickling a byte at a time cannot hold every connection;
- the body is one JSON object (400) whose fields are known, a string prompt and whole,
  finite, non-negative numbers for the rest (400); the session then checks them against the
  model.

``CalmServer`` holds at most ``max_connections`` connections at once (the next one is answered
503 and closed), gives each that deadline and a socket timeout for writing, and treats a client that hangs up or goes quiet
as nothing worth printing.
"""

from __future__ import annotations

import io
import ipaddress
import json
import math
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 64 * 1024  # a prompt is cut to max_tokens anyway
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT = 10.0  # seconds a client has to send its whole request (and for each write)
LINGER = 2.0  # seconds in all to discard what a refused client still sends, so it reads the answer
MAX_INDEX = 1 << 20  # the largest block, head or position a request may name
STEP_FIELDS = ("prompt", "layer", "head", "position")


class Refused(Exception):
    """A request that gets ``code`` and ``{"error": message}``."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def error_line(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str) -> frozenset[str] | None:
    """Host names a request may carry for a server bound to ``bind`` (None: any, for a server
    listening on every interface, which --allow-remote asked for)."""
    if bind in ("", "0.0.0.0", "::"):
        return None
    return frozenset({"127.0.0.1", "localhost", "::1", bind.strip("[]").lower()})


def host_name(host_header: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1'; '[::1]:8000' -> '::1'."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def check_host(headers, allowed: frozenset[str] | None) -> None:
    host = host_name(headers.get("Host") or "")
    if allowed is not None and host not in allowed:
        raise Refused(403, f"gpt-explain serves 127.0.0.1 only, not {host[:60]!r}")


def check_origin(headers) -> None:
    """The page's own origin, or a client that is no browser (no Origin, no Sec-Fetch-Site)."""
    origin = headers.get("Origin")
    own = "http://" + (headers.get("Host") or "").strip().lower()
    if origin is not None and origin.strip().lower() != own:
        raise Refused(403, f"cross-origin request from {origin[:60]!r} refused")
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site.strip().lower() not in ("same-origin", "none"):
        raise Refused(403, f"a {site[:30]!r} request is refused: only the page itself may post")


def check_json_type(headers) -> None:
    ctype = (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
    if ctype != "application/json":
        got = repr(ctype[:60]) if ctype else "none"
        raise Refused(415, f"the body must be Content-Type: application/json, got {got}")


def content_length(headers) -> int:
    if headers.get("Transfer-Encoding"):
        raise Refused(411, "chunked bodies are not accepted: send Content-Length")
    values = headers.get_all("Content-Length") or []
    if not values:
        raise Refused(411, "a POST needs a Content-Length header")
    if len(values) > 1:
        raise Refused(400, "more than one Content-Length header")
    text = values[0].strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise Refused(400, f"Content-Length must be a byte count, got {text[:30]!r}")
    n = int(text)
    if n > MAX_BODY:
        raise Refused(413, f"the request is {n} bytes; the limit is {MAX_BODY}")
    return n


def read_body(rfile, n: int) -> bytes:
    try:
        body = rfile.read(n)
    except TimeoutError:
        raise Refused(408, f"the body did not arrive: {n} bytes announced") from None
    if len(body) != n:
        raise Refused(400, f"the body ended after {len(body)} of {n} bytes")
    return body


def parse_object(body: bytes, fields=STEP_FIELDS) -> dict:
    """The body as a JSON object with only ``fields`` (an empty body is ``{}``)."""
    try:
        req = json.loads(body.decode("utf-8")) if body.strip() else {}
    except (UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise Refused(400, f"the body is not JSON: {str(e)[:80]}") from None
    if not isinstance(req, dict):
        raise Refused(400, f"the body must be a JSON object, not {type(req).__name__}")
    unknown = sorted(set(req) - set(fields))
    if unknown:
        raise Refused(400, f"unknown field {unknown[0][:40]!r}; known: {', '.join(fields)}")
    return req


def index(name: str, v) -> int | None:
    """A whole, finite number in 0..MAX_INDEX (3.0 is 3), or None."""
    if v is None:
        return None
    whole = isinstance(v, int) and not isinstance(v, bool)
    whole = whole or isinstance(v, float) and math.isfinite(v) and v.is_integer()
    if not whole:
        raise Refused(400, f"{name} must be a whole number, got {json.dumps(v)[:40]}")
    if not 0 <= v <= MAX_INDEX:
        raise Refused(400, f"{name} {str(v)[:40]} is out of range 0..{MAX_INDEX}")
    return int(v)


def step_args(req: dict) -> dict:
    """The step settings of a request: prompt (str or None), layer, head, position."""
    prompt = req.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise Refused(400, f"prompt must be a string, not {type(prompt).__name__}")
    return {"prompt": prompt, **{k: index(k, req.get(k)) for k in STEP_FIELDS[1:]}}


class DeadlineReader(io.RawIOBase):
    """A socket's reads, each allowed only the time left until one deadline: a per-read
    timeout alone lets a client that sends a byte every few seconds hold its connection."""

    def __init__(self, sock: socket.socket, seconds: float):
        self.sock, self.seconds = sock, seconds
        self.deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the request did not arrive within {self.seconds:g} s")
        self.sock.settimeout(left)
        try:
            return self.sock.recv_into(buf)
        finally:
            self.sock.settimeout(self.seconds)  # writing the answer has the usual timeout


class CalmHandler(BaseHTTPRequestHandler):
    """A request handler whose errors are one JSON line and whose log is silent.

    Subclasses define ``get(path)`` and ``post(path, request)``; both return
    ``(status, object)`` or raise ``Refused``.
    """

    server_version = "gpt-explain"

    def setup(self):
        super().setup()
        self.rfile.close()  # the plain reader, replaced by one with the request's deadline
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, self.server.request_timeout))

    def parse_request(self) -> bool:
        """The standard parser, less HTTP/0.9: ``GET /`` alone is answered 400 at once (the
        standard library would go on to read headers that such a client never sends)."""
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        if len(self.requestline.split()) == 2:
            self.command, self.request_version = None, "HTTP/1.0"
            self.close_connection = True
            self.send_error(400, "HTTP/0.9 requests are not served: send 'GET / HTTP/1.1'")
            return False
        return super().parse_request()

    def log_message(self, format, *args):
        pass  # one line per request would bury the URL printed at the start

    def send_body(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if code >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, code: int, obj) -> None:
        self.send_body(code, json.dumps(obj, allow_nan=False).encode() + b"\n")

    def send_error(self, code, message=None, explain=None):
        """The standard library's errors (a bad request line, an unknown method), as JSON."""
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = 405, f"method {str(self.command)[:20]!r} is not allowed: GET or POST"
        if self.request_version == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # so that the status line goes out
        phrase = self.responses.get(code, ("error",))[0]
        self.send_body(code, error_line(message or phrase))

    def _answer(self, fn, *args) -> None:
        try:
            check_host(self.headers, self.server.allowed_hosts)
            code, obj = fn(*args)
        except Refused as e:
            return self.send_body(e.code, error_line(str(e)))
        except (ConnectionError, TimeoutError):
            raise  # the client is gone: CalmServer.handle_error stays quiet
        except Exception as e:  # a bug, not a bad request: one line here and there
            print(f"gpt-explain: {self.command} failed: {type(e).__name__}: {e}", file=sys.stderr)
            return self.send_body(500, error_line(f"internal error: {type(e).__name__}: {e}"))
        if isinstance(obj, bytes):
            self.send_body(code, obj, "text/html; charset=utf-8")
        else:
            self.send_json(code, obj)

    def do_GET(self):
        self._answer(self.get, self.path.split("?", 1)[0])

    def do_POST(self):
        self._answer(self._post)

    def _post(self):
        check_origin(self.headers)
        check_json_type(self.headers)
        n = content_length(self.headers)
        return self.post(self.path.split("?", 1)[0], parse_object(read_body(self.rfile, n)))

    def get(self, path: str):
        raise Refused(404, f"no such page: {path[:80]}")

    def post(self, path: str, request: dict):
        raise Refused(404, f"no such endpoint: {path[:80]}")


_BUSY = error_line("the server is busy: too many connections; try again")
_BUSY_REPLY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


class CalmServer(ThreadingHTTPServer):
    """A threading HTTP server with a connection cap, a socket timeout, and quiet errors."""

    daemon_threads = True
    block_on_close = False  # closing does not wait for idle clients to time out

    def __init__(
        self,
        address,
        handler,
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = REQUEST_TIMEOUT,
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.max_connections, self.request_timeout = max_connections, timeout
        self.open = 0  # connections being handled
        self.changed = threading.Condition()
        self.allowed_hosts = allowed_hosts(address[0])
        super().__init__(address, handler)

    def get_request(self):
        sock, addr = super().get_request()
        sock.settimeout(self.request_timeout)  # each write; reads share one deadline (setup)
        return sock, addr

    def process_request(self, request, client_address):
        with self.changed:
            busy = self.open >= self.max_connections
            self.open += not busy
        if busy:
            try:
                request.sendall(_BUSY_REPLY)
            except OSError:
                pass
            super().shutdown_request(request)  # no lingering here: this is the accepting thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def shutdown_request(self, request):
        """Close after the answer, first reading what the client still sends (a refused body):
        closing with unread data resets the connection, and the client may lose the answer."""
        seconds = min(LINGER, self.request_timeout)
        deadline = time.monotonic() + seconds  # one deadline for the drain, not one per read
        try:
            request.shutdown(socket.SHUT_WR)
            for _ in range(16):  # at most 1 MiB
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                request.settimeout(left)
                if not request.recv(65536):
                    break
        except OSError:
            pass
        self.close_request(request)

    def _done(self) -> None:
        with self.changed:
            self.open -= 1
            self.changed.notify_all()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no connection is being handled; False if one still is after timeout."""
        with self.changed:
            return self.changed.wait_for(lambda: self.open == 0, timeout)

    def handle_error(self, request, client_address):
        e = sys.exc_info()[1]
        if isinstance(e, (ConnectionError, TimeoutError)):
            return  # the client hung up or went quiet: nothing to answer, nothing to print
        print(f"gpt-explain: a request failed: {type(e).__name__}: {e}", file=sys.stderr)
