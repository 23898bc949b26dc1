"""gpt-explain --serve: the local page's API, and the page itself in headless Chromium.

The Chromium test also takes a screenshot of the page after two steps; with
``GPT_EXPLAIN_SCREENSHOT=docs/gpt-explain-serve.png`` in the environment it is copied there
(that is how the screenshot in docs/ is made)."""

import json
import os
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request

import pytest
from test_explain_story import check_story

import tensorgrad as tg
from gpt.config import GPTConfig
from gpt.explain import explain, prompt_tokenizer
from gpt.explain.render.story import render_story
from gpt.explain.serve.server import make_server
from gpt.explain.steps import Session, follow_steps
from gpt.model import GPT

PROMPT = "The capital of France is Paris"
CHROMIUM = "/usr/bin/chromium"


def tiny(tok):
    tg.manual_seed(0)
    return GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))


@pytest.fixture(scope="module")
def tok():
    return prompt_tokenizer(PROMPT)


@pytest.fixture
def server(tok):
    srv = make_server(Session(tiny(tok), tok, PROMPT), source="test model")
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def call(url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_served_step_is_the_reports_step(server, tok):
    code, state = call(f"{server}/api/state")
    assert code == 200 and state["report"] is None and state["source"] == "test model"
    assert state["story"] is None
    code, state = call(f"{server}/api/step", {})
    assert code == 200
    served = state["report"]
    assert state["story"] == render_story(served)  # the static page's drawing of this report
    assert served.pop("step") == 1
    assert served == explain(tiny(tok), tok, PROMPT, heads=[0])  # every number, exactly


def test_served_steps_are_the_steps_report(server, tok):
    for _ in range(3):
        code, state = call(f"{server}/api/step", {"prompt": PROMPT})
    assert code == 200 and state["report"]["step"] == 3
    want = follow_steps(tiny(tok), tok, PROMPT, 3)
    got = state["trace"]["steps"]
    assert [s["loss"] for s in got] == [s["loss"] for s in want["steps"]]
    assert [s["followed"] for s in got] == [s["followed"] for s in want["steps"]]


def test_bad_requests_are_refused_with_one_line(server):
    code, body = call(f"{server}/api/step", {"layer": 9})
    assert code == 400 and body["error"] == "layer 9 is outside 0..1"
    code, body = call(f"{server}/api/step", {"prompt": "x" * 70_000})
    assert code == 413 and "limit" in body["error"]
    code, body = call(f"{server}/api/state", headers={"Host": "example.com"})
    assert code == 403 and "127.0.0.1 only" in body["error"]
    code, body = call(f"{server}/nothing")
    assert code == 404
    code, state = call(f"{server}/api/state")
    assert state["trace"]["steps"] == [] and state["trace"]["layer"] == 0  # nothing changed


def test_the_page_is_local(server):
    with urllib.request.urlopen(server + "/", timeout=30) as r:
        page = r.read().decode()
    assert page.startswith("<!doctype html>") and 'id="step"' in page
    assert "http://" not in page and "https://" not in page and "<link" not in page


def _values(dom, pattern):
    return [float(v) for v in re.findall(pattern, dom)]


@pytest.mark.skipif(
    not shutil.which(CHROMIUM),
    reason=f"no headless Chromium at {CHROMIUM} "
    "(apt-get install chromium) to drive the served page",
)
def test_the_page_in_headless_chromium(server, tok, tmp_path):
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=30000",
    ]
    run = subprocess.run(
        [*flags, "--dump-dom", f"{server}/?autostep=2"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    dom = re.sub(r"<script>.*?</script>", "", run.stdout.decode(), flags=re.DOTALL)  # the markup
    assert 'data-ready="1"' in dom, run.stderr.decode(errors="replace")[-2000:]
    assert re.search(r'id="stepnum" data-value="2"', dom)
    # the numbers on the page are the report's: the loss of each step ...
    want = follow_steps(tiny(tok), tok, PROMPT, 2)
    assert _values(
        dom,
        r'<tr class="hist" data-step="\d+"><td>\d+</td><td><span '
        r'data-value="([^"]+)"',
    ) == [s["loss"] for s in want["steps"]]
    loss = _values(dom, r'id="loss" data-value="([^"]+)"')
    assert loss == [want["steps"][1]["loss"]]
    # ... and of step 2's report: attention, ablation, finite differences
    model = tiny(tok)
    s = Session(model, tok, PROMPT)
    s.step()
    r = s.step()
    cells = _values(dom, r'<rect class="cell" data-value="([^"]+)"')
    att = r["attention_all"][0][0]
    assert cells == [att[i][j] for i in range(len(att)) for j in range(i + 1)]
    abl = _values(dom, r'class="abl" data-layer="\d" data-head="\d" data-value="([^"]+)"')
    assert abl == [d for row in r["ablation"]["delta"] for d in row]
    # the story of step 2: every stage's values and gradient norm, the head's weights' gradients,
    # the embedding split, AdamW on the followed weights, the evidence, before and after
    check_story(dom, r)
    # a screenshot of the page as it is now (the session has run its 2 steps: none is added)
    shot = tmp_path / "page.png"
    run = subprocess.run(
        [*flags, "--window-size=1280,1900", f"--screenshot={shot}", f"{server}/?autostep=2"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", run.stderr[-2000:]
    if os.environ.get("GPT_EXPLAIN_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["GPT_EXPLAIN_SCREENSHOT"])


def test_the_command_prints_its_address_and_serves(tmp_path):
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpt.explain", "--serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line + proc.stderr.read() if proc.poll() is not None else line
        code, state = call(url.group(0) + "api/step", {})
        assert code == 200 and state["report"]["step"] == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
