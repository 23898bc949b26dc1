"""gpt-explain --serve against hostile and clumsy clients: one 4xx JSON line, no step, no
traceback. Requests go over raw sockets, so that the bytes are exactly the ones named."""

import json
import re
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

import tensorgrad as tg
from gpt.config import GPTConfig
from gpt.explain import prompt_tokenizer
from gpt.explain.cli import main
from gpt.explain.serve.server import make_server
from gpt.explain.steps import Session
from gpt.model import GPT

PROMPT = "The capital of France is Paris"


@pytest.fixture(scope="module")
def tok():
    return prompt_tokenizer(PROMPT)


def tiny(tok):
    tg.manual_seed(0)
    return GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))


def start(tok, **kw):
    srv = make_server(Session(tiny(tok), tok, PROMPT), **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def shared(tok):
    srv = start(tok)
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def srv(shared):
    shared.session = shared.restart()  # no steps, whatever the test before did
    return shared


def exchange(srv, data: bytes, close_write: bool = True) -> bytes:
    """Send data, then read the whole answer (the server closes after one request)."""
    with socket.create_connection(srv.server_address[:2], timeout=60) as s:
        s.sendall(data)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def status_and_error(answer: bytes) -> tuple[int, str]:
    """The status code and the error of a one-line JSON answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1."), answer[:200]
    assert b"application/json" in head, head
    assert body.endswith(b"\n") and body.count(b"\n") == 1, body  # one line
    obj = json.loads(body)
    assert list(obj) == ["error"] and obj["error"], obj
    return int(head.split()[1]), obj["error"]


def post(srv, body: bytes, *headers: str, path="/api/step", length=True) -> bytes:
    port = srv.server_address[1]
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode() + b"\r\n\r\n" + body


JSON = "Content-Type: application/json"
EVIL = "Origin: http://evil.example"


def hostile(port):
    """(name, request bytes, status, a word of the error) for each refused request."""
    p = f"127.0.0.1:{port}"
    raw = f"POST /api/step HTTP/1.1\r\nHost: {p}\r\n{JSON}\r\n".encode()
    step = b"POST /api/step HTTP/1.1\r\nHost: " + p.encode()
    return [
        ("no length", raw + b"\r\n{}", 411, "Content-Length"),
        ("word length", raw + b"Content-Length: abc\r\n\r\n{}", 400, "byte count"),
        ("negative length", raw + b"Content-Length: -2\r\n\r\n{}", 400, "byte count"),
        ("float length", raw + b"Content-Length: 2.0\r\n\r\n{}", 400, "byte count"),
        ("two lengths", raw + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400, "one"),
        ("huge length", raw + b"Content-Length: 99999999999\r\n\r\n", 413, "limit"),
        ("big body", b'{"prompt": "' + b"x" * 300_000 + b'"}', 413, "limit"),
        ("long length", raw + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n", 400, "byte"),
        ("chunked", raw + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 411, "chunk"),
        ("short body", raw + b"Content-Length: 10\r\n\r\n{}", 400, "ended"),
        ("not json", None, 400, "not JSON"),
        ("not utf-8", b"\xff\xfe{}", 400, "not JSON"),
        ("a list", b"[1, 2]", 400, "JSON object"),
        ("inf position", b'{"position": 1e999}', 400, "position"),
        ("nan position", b'{"position": NaN}', 400, "position"),
        ("infinity layer", b'{"layer": -Infinity}', 400, "layer"),
        ("negative layer", b'{"layer": -1}', 400, "layer"),
        ("huge layer", b'{"layer": ' + b"9" * 40 + b"}", 400, "layer"),
        ("huge head", b'{"head": 1e300}', 400, "head"),
        ("fraction", b'{"position": 2.5}', 400, "whole"),
        ("string head", b'{"head": "0"}', 400, "whole"),
        ("bool head", b'{"head": true}', 400, "whole"),
        ("list layer", b'{"layer": [0]}', 400, "whole"),
        ("number prompt", b'{"prompt": 5}', 400, "prompt"),
        ("unknown field", b'{"lr": 1}', 400, "unknown"),
        ("layer beyond model", b'{"layer": 9}', 400, "outside"),
        ("empty prompt", b'{"prompt": ""}', 400, "token"),
        ("text/plain", ("text", b'{"prompt": "x y"}'), 415, "application/json"),
        ("form", ("form", b"prompt=x"), 415, "application/json"),
        ("no type", ("none", b"{}"), 415, "application/json"),
        ("evil text/plain", ("evil-text", b"{}"), 403, "evil.example"),
        ("evil json", ("evil-json", b"{}"), 403, "evil.example"),
        ("other local port", ("other-port", b"{}"), 403, "cross-origin"),
        ("null origin", ("null", b"{}"), 403, "cross-origin"),
        ("cross-site fetch", ("cross-site", b"{}"), 403, "cross-site"),
        ("rebound host", step.replace(p.encode(), b"evil.example") + b"\r\n\r\n", 403, "only"),
        ("no endpoint", ("path", b"{}"), 404, "no such"),
        ("put", f"PUT /api/step HTTP/1.1\r\nHost: {p}\r\n\r\n".encode(), 405, "PUT"),
        ("options", f"OPTIONS /api/step HTTP/1.1\r\nHost: {p}\r\n\r\n".encode(), 405, "allowed"),
        ("garbage", b"\x16\x03\x01 hello there friend\r\n\r\n", 400, "Bad"),
        ("long address", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "URI"),
        ("many headers", step + b"\r\n" + b"X: y\r\n" * 120 + b"\r\n", 431, "headers"),
    ]


HEADERS = {
    "text": ["Content-Type: text/plain"],
    "form": ["Content-Type: application/x-www-form-urlencoded"],
    "none": [],
    "evil-text": [EVIL, "Content-Type: text/plain"],
    "evil-json": [EVIL, JSON],
    "null": ["Origin: null", JSON],
    "cross-site": ["Sec-Fetch-Site: cross-site", JSON],
}


def request_bytes(srv, data):
    if isinstance(data, bytes) and data.startswith((b"POST", b"PUT", b"OPTIONS", b"GET", b"\x16")):
        return data
    if data is None:
        return post(srv, b"{position: 3}", JSON)
    if isinstance(data, bytes):
        return post(srv, data, JSON)
    kind, body = data
    port = srv.server_address[1]
    if kind == "other-port":
        return post(srv, body, f"Origin: http://127.0.0.1:{port + 1}", JSON)
    if kind == "path":
        return post(srv, body, JSON, path="/api/nothing")
    return post(srv, body, *HEADERS[kind])


CASES = hostile(0)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_a_hostile_request_gets_one_json_line(srv, case, capsys):
    name, data, want, word = hostile(srv.server_address[1])[case]
    code, error = status_and_error(exchange(srv, request_bytes(srv, data)))
    assert srv.wait_idle()
    assert (code, word.lower() in error.lower()) == (want, True), (name, code, error)
    assert srv.session.history == [] and srv.session.report is None  # no step was taken
    assert capsys.readouterr().err == ""  # no traceback, no line


def test_the_page_own_post_steps(srv, tok, capsys):
    port = srv.server_address[1]
    origin = f"Origin: http://127.0.0.1:{port}"
    data = post(srv, b'{"position": 3.0}', origin, "Sec-Fetch-Site: same-origin", JSON)
    answer = exchange(srv, data)
    assert answer.startswith(b"HTTP/1.0 200"), answer[:300]
    assert srv.session.report["step"] == 1 and srv.session.position == 3
    assert capsys.readouterr().err == ""


def test_reset_restores_the_first_weights_and_takes_a_prompt(tok):
    srv = start(tok)
    try:
        for _ in range(2):
            assert exchange(srv, post(srv, b"{}", JSON)).startswith(b"HTTP/1.0 200")
        code, error = status_and_error(
            exchange(srv, post(srv, b'{"prompt": "a"}', JSON, path="/api/reset"))
        )
        assert code == 400 and srv.session.report["step"] == 2  # a bad prompt changes nothing
        answer = exchange(srv, post(srv, b'{"prompt": "Paris is"}', JSON, path="/api/reset"))
        state = json.loads(answer.partition(b"\r\n\r\n")[2])
        assert state["report"] is None and state["trace"]["steps"] == []
        assert state["trace"]["prompt"] == "Paris is"
        exchange(srv, post(srv, b"{}", JSON))
        fresh = Session(tiny(tok), tok, "Paris is").step(snapshot=False)
        assert srv.session.report == fresh  # the same weights, a fresh optimizer
    finally:
        srv.shutdown()
        srv.server_close()


def test_loading_the_page_and_the_state_never_steps(srv):
    port = srv.server_address[1]
    for path in ("/", "/api/state", "/?autostep=3"):
        answer = exchange(srv, f"GET {path} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.0 200")
    assert srv.session.history == []


def test_a_client_that_hangs_up_is_not_an_error(srv, capsys):
    port = srv.server_address[1]
    for path in ("/", "/api/state"):
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # a reset, not a goodbye: the server's write or read fails
    assert srv.wait_idle()
    assert capsys.readouterr().err == ""


def test_a_silent_client_times_out_and_a_slow_body_gets_408(tok, capsys):
    srv = start(tok, timeout=0.5)
    try:
        assert exchange(srv, b"", close_write=False) == b""  # dropped, nothing said
        slow = post(srv, b"{}", JSON).replace(b"Content-Length: 2", b"Content-Length: 9")
        code, error = status_and_error(exchange(srv, slow, close_write=False))
        assert code == 408 and "9 bytes" in error
        assert srv.wait_idle() and srv.session.history == []
    finally:
        srv.shutdown()
        srv.server_close()
    assert capsys.readouterr().err == ""


def test_connections_beyond_the_cap_get_503_and_the_server_recovers(tok, capsys):
    srv = start(tok, max_connections=3, timeout=60)
    addr = srv.server_address[:2]
    idle = [socket.create_connection(addr, timeout=30) for _ in range(3)]
    try:
        code, error = status_and_error(exchange(srv, b"", close_write=False))
        assert code == 503 and "busy" in error
    finally:
        for s in idle:
            s.close()
    assert srv.wait_idle()
    port = addr[1]
    answer = exchange(srv, f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 200")
    srv.shutdown()
    srv.server_close()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "example.com", "::"])
def test_serving_beyond_loopback_needs_allow_remote(host, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--serve", "--host", host])
    assert e.value.code == 2 and "--allow-remote" in capsys.readouterr().err


CHROMIUM = "/usr/bin/chromium"


def dump_dom(url: str, profile: Path) -> str:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync"]
    run = subprocess.run(
        [CHROMIUM, *flags, f"--user-data-dir={profile}", "--virtual-time-budget=30000"]
        + ["--dump-dom", url],
        capture_output=True,
        timeout=120,
        check=False,
    )
    dom = re.sub(r"<script>.*?</script>", "", run.stdout.decode(), flags=re.DOTALL)
    assert 'data-ready="1"' in dom, run.stderr.decode(errors="replace")[-2000:]
    return dom


@pytest.mark.skipif(
    not shutil.which(CHROMIUM),
    reason=f"no headless Chromium at {CHROMIUM} (apt-get install chromium)",
)
def test_loading_and_reloading_the_page_never_steps_in_chromium(srv, tmp_path, capsys):
    url = f"http://127.0.0.1:{srv.server_address[1]}/"
    dom = dump_dom(url, tmp_path / "profile")
    assert srv.session.history == [] and 'id="stepnum" data-value="0"' in dom
    assert "Press Step to run the first training step" in dom
    for _ in range(2):  # a load that asks for 2 steps, then a reload of it: 2 steps in all
        dom = dump_dom(url + "?autostep=2", tmp_path / "profile")
        assert len(srv.session.history) == 2 and 'id="stepnum" data-value="2"' in dom
    # the heat map's axes and colour scale, the charts' step axis, the explanations
    assert "query t (the token attending)" in dom and "key s (the token attended to)" in dom
    assert 'fill="url(#scale)"' in dom and "attention weight" in dom
    assert dom.count(">step</text>") == 2 and "loss on the prompt</text>" in dom
    assert "one training step on the prompt alone" in dom
    assert "memorises the prompt" in dom and 'id="reset"' in dom
    assert srv.wait_idle() and capsys.readouterr().err == ""
