"""The command lines against hostile files and arguments: one line, in bounded time.

A deeply nested tokenizer.json (gpt-sample, gpt-train --init-from), a --data name that is not
UTF-8, gpt-plot on malformed metrics.jsonl rows or with --output a directory, the launcher
given a non-ASCII digit, a huge rank count or a missing script, gpt-explain on a long prompt
(its BPE is learned from a bounded beginning), and the served page against a client that
trickles its request (one deadline for the whole request, not one per read).
"""

import importlib.util
import os
import random
import select
import socket
import threading
import time

import pytest

import tensorgrad as tg
from gpt import plot, sample, train
from gpt.config import GPTConfig
from gpt.model import GPT
from gpt.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer_dir
from tensorgrad.distributed import run as launcher

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
DEEP = {"lists": "[" * 100_000 + "]" * 100_000, "objects": '{"a":' * 100_000 + "1" + "}" * 100_000}


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err[-2000:]
    return err


# ----------------------------------------------------------------------------- tokenizer files
@pytest.fixture
def hf_dir(tmp_path):
    """A tiny GPT-2 directory as gpt-export writes it, with a character tokenizer.json."""
    tok = CharTokenizer("abc de")
    tg.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=tok.vocab_size)
    GPT(cfg).save_pretrained(tmp_path / "hf", tok)
    return tmp_path / "hf"


@pytest.mark.parametrize("kind", DEEP)
def test_a_deeply_nested_tokenizer_json_is_one_line_in_gpt_sample(hf_dir, kind, capsys):
    (hf_dir / "tokenizer.json").write_text(DEEP[kind])
    assert sample.main(["--init-from", str(hf_dir), "--max-new-tokens", "2"]) == 1
    err = one_line(capsys.readouterr().err)
    assert "cannot load the tokenizer" in err and "nested" in err


def test_a_deeply_nested_tokenizer_json_is_one_line_in_gpt_train(
    hf_dir, tmp_path, monkeypatch, capsys
):
    (hf_dir / "tokenizer.json").write_text(DEEP["lists"])
    corpus = tmp_path / "c.txt"
    corpus.write_text("abc de " * 40)
    monkeypatch.setenv("GPT_CACHE_DIR", str(tmp_path / "cache"))
    args = ["--init-from", str(hf_dir), "--data", str(corpus), "--out-dir", str(tmp_path / "o")]
    assert train.main([*args, "--max-iters", "1", "--no-sample"]) == 1
    err = one_line(capsys.readouterr().err)
    assert "cannot load the tokenizer" in err and "nested" in err


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.json"])
def test_a_tokenizer_file_over_the_size_bound_is_refused_unread(tmp_path, monkeypatch, name):
    import gpt.tokenizer as t

    BPETokenizer.train("abc abd abe", 260).save(tmp_path)
    if name == "tokenizer.json":
        CharTokenizer("ab").save(tmp_path / "char")
        tmp_path = tmp_path / "char"
    monkeypatch.setattr(t, "MAX_FILE_BYTES", (tmp_path / name).stat().st_size - 1)
    with pytest.raises(ValueError, match=f"{name} is .* bytes, more than"):
        load_tokenizer_dir(tmp_path)


# ----------------------------------------------------------------------------- gpt-train --data
def test_a_data_name_that_is_not_utf8_is_one_line(tmp_path, capsys):
    try:
        raw = os.fsencode(tmp_path) + b"/bad\xffname.txt"
        with open(raw, "wb") as f:
            f.write(b"to be or not to be\n" * 20)
    except (OSError, UnicodeError):
        pytest.skip(
            "this file system does not take a name that is not UTF-8: point TMPDIR (or "
            "--basetemp) at one that does, e.g. ext4 or tmpfs"
        )
    name = os.fsdecode(raw)  # the surrogate-escaped str that sys.argv would hold
    assert train.main(["--data", name, "--out-dir", str(tmp_path / "o"), "--max-iters", "1"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--data" in err and "UTF-8" in err and "\\xff" in err


# ----------------------------------------------------------------------------- gpt-plot
def write_metrics(d, lines: list[str]) -> None:
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")


BAD_ROWS = [
    '{"iter": 1, "loss": "high"}',
    '{"iter": null, "loss": 2.0}',
    '{"iter": "3", "loss": 2.0}',
    '{"iter": 4, "loss": null}',
    '{"iter": 5, "val_loss": 2.0}',
    '{"iter": 6, "train_loss": [1], "val_loss": 2.0}',
    '{"iter": 7, "diag": {"update_ratio": "x"}}',
    '{"iter": 8, "diag": {"update_ratio": {"h.0": "x"}, "grad_norm": null}}',
    '{"iter": true, "loss": 2.0}',
    '"a string"',
    "null",
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,
    '{"iter": 9, "loss": ' + "[" * 50_000 + "]" * 50_000 + "}",
]


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed: pip install -e '.[plot]'")
def test_gpt_plot_skips_rows_and_values_it_cannot_draw(tmp_path, capsys):
    good = ['{"iter": 0, "loss": 3.0}', '{"iter": 2, "train_loss": 2.5, "val_loss": 2.6}']
    write_metrics(tmp_path, [good[0], *BAD_ROWS, good[1]])
    assert plot.main([str(tmp_path)]) == 0, capsys.readouterr().err
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gpt_plot_with_no_drawable_row_is_one_line(tmp_path, capsys):
    write_metrics(tmp_path, BAD_ROWS)
    assert plot.main([str(tmp_path)]) == 1
    assert "holds no records" in one_line(capsys.readouterr().err)


def test_gpt_plot_output_a_directory_is_one_line(tmp_path, capsys):
    write_metrics(tmp_path, ['{"iter": 0, "loss": 3.0}'])
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "keep.txt").write_text("mine")
    assert plot.main([str(tmp_path), "--output", str(tmp_path / "dir")]) == 2
    assert "is a directory" in one_line(capsys.readouterr().err)
    assert [p.name for p in (tmp_path / "dir").iterdir()] == ["keep.txt"]


# ----------------------------------------------------------------------------- the launcher
@pytest.fixture
def no_launch(monkeypatch):
    """The launcher's mpiexec call, recorded instead of run."""
    calls = []
    monkeypatch.setattr(launcher, "find_mpiexec", lambda: ["mpiexec"])
    monkeypatch.setattr(launcher.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    return calls


@pytest.mark.parametrize(
    "n, words",
    [
        ("\u0663", "ASCII"),  # ARABIC-INDIC DIGIT THREE: int() takes it
        ("\uff12", "ASCII"),  # FULLWIDTH DIGIT TWO
        ("0", "positive"),
        ("-1", "positive"),
        ("two", "positive"),
        ("1000000", "at most"),
        pytest.param("9" * 5000, "at most", id="5000 digits"),
    ],
)
def test_the_launcher_refuses_a_bad_rank_count_before_launching(tmp_path, no_launch, n, words):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    with pytest.raises(SystemExit) as e:
        launcher.main(["--nproc_per_node", n, str(script)])
    msg = str(e.value.code)
    assert msg.startswith("tensorgrad.distributed.run: error:") and "\n" not in msg
    assert words in msg and no_launch == []


def test_the_launcher_refuses_a_missing_script_before_launching(tmp_path, no_launch):
    with pytest.raises(SystemExit) as e:
        launcher.main(["--nproc_per_node", "2", str(tmp_path / "nope.py")])
    assert "nope.py" in str(e.value.code) and "no such file" in str(e.value.code)
    assert no_launch == []


def test_the_launcher_starts_a_good_request(tmp_path, no_launch):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert launcher.main(["--nproc_per_node", "2", str(script), "--lr", "3"]) == 0
    (cmd,) = no_launch
    assert cmd[:3] == ["mpiexec", "-n", "2"] and cmd[-3:] == [str(script), "--lr", "3"]


# ----------------------------------------------------------------------------- gpt-explain
def words(n: int, seed: int = 0) -> str:
    rnd = random.Random(seed)
    return " ".join(
        "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 9)))
        for _ in range(n)
    )


def test_the_prompt_bpe_is_learned_from_a_bounded_beginning():
    from gpt.explain import prompt_tokenizer
    from gpt.explain.report import MAX_PROMPT_BYTES

    tok = prompt_tokenizer(words(5000))  # 5000 different words: was ~15,000 merges
    assert tok.vocab_size <= 257 + MAX_PROMPT_BYTES


def test_an_ordinary_prompt_gets_the_tokenizer_and_tokens_it_got_before():
    from gpt.explain import prompt_ids, prompt_tokenizer

    for prompt in [
        "The capital of France is Paris",
        words(200),
        words(100) + " 東京は日本の首都です。",
    ]:
        before = BPETokenizer.train(prompt, vocab_size=257 + len(prompt.encode("utf-8")))
        tok = prompt_tokenizer(prompt)
        assert tok.vocab == before.vocab and tok.merges == before.merges
        assert prompt_ids(tok, prompt, 1024)[0] == before.encode(prompt)[:64]


def test_a_long_prompt_keeps_its_first_tokens():
    """The tokens shown for a long prompt are its first words, as they were before the bound."""
    from gpt.explain import prompt_ids, prompt_tokenizer

    prompt = words(3000)
    for kind in ("bpe", "char"):
        tok = prompt_tokenizer(prompt, kind)
        for max_tokens in (64, 256):
            ids, notes = prompt_ids(tok, prompt, 1024, max_tokens)
            assert len(ids) == max_tokens and "were cut to the first" in notes[0]
            want = prompt.split(" ") if kind == "bpe" else list(prompt)
            got = [tok.decode([i]).strip() for i in ids]
            assert got == [w.strip() for w in want[:max_tokens]]


def test_a_long_prompt_is_encoded_only_in_part(monkeypatch):
    """The served page and --init-from's tokenizer encode a bounded beginning of the prompt."""
    from gpt.explain import prompt_ids
    from gpt.explain.report import MAX_PROMPT_BYTES

    tok = BPETokenizer.train(words(50), 400)
    seen = []
    real = tok.encode_ordinary
    monkeypatch.setattr(tok, "encode_ordinary", lambda s: seen.append(len(s)) or real(s))
    cjk = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(8000))  # one 8000-char word
    for prompt in (words(5000), cjk, "a " + cjk, " " * 20000):
        try:
            prompt_ids(tok, prompt, 1024, 256)
        except ValueError as e:  # the 1-token prompts (the CJK word: says why it is one)
            assert "a training step needs at least 2" in str(e) or "one word of" in str(e)
    assert seen and max(seen) <= MAX_PROMPT_BYTES


def test_gpt_explain_on_8000_cjk_characters_is_one_line(capsys):
    from gpt.explain import main

    cjk = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(8000))
    assert main(["--prompt", cjk, "--format", "json", "--checks", "0"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "one word of" in line and "--tokenizer char" in line, line


# ----------------------------------------------------------------------------- the served page
@pytest.mark.parametrize("phase", ["headers", "body"])
def test_a_client_trickling_its_request_is_dropped_at_the_deadline(phase, capsys):
    """One byte at a time, each read well within the per-read timeout: the whole request still
    has one deadline, after which the server closes (headers) or answers 408 (body), and the
    slot is free for the next client."""
    from gpt.explain import prompt_tokenizer
    from gpt.explain.serve.server import make_server
    from gpt.explain.steps import Session

    prompt = "The capital of France is Paris"
    tok = prompt_tokenizer(prompt)
    tg.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))
    srv = make_server(Session(model, tok, prompt), max_connections=1, timeout=0.5)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    addr = srv.server_address[:2]
    host = f"127.0.0.1:{addr[1]}"
    body = b'{"prompt": "' + b"x" * 200 + b'"}'
    head = (
        f"POST /api/step HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"X-Pad: {'a' * 200}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sent, data = (b"", head) if phase == "headers" else (head, body)
    stop = threading.Event()
    answer = []

    def trickle():
        with socket.create_connection(addr, timeout=30) as s:
            try:
                s.sendall(sent)
                for i in range(len(data)):
                    s.sendall(data[i : i + 1])
                    # 10 bytes a second, each read in time; stop once the server answers
                    if select.select([s], [], [], 0.1)[0] or stop.is_set():
                        break
                answer.append(s.recv(65536))
            except OSError:
                answer.append(b"")  # the server closed on us

    t = threading.Thread(target=trickle, daemon=True)
    try:
        t.start()
        while srv.open == 0 and t.is_alive():  # it takes the one slot...
            time.sleep(0.01)
        assert srv.wait_idle(5)  # ...until the deadline (not 20 s of trickling) frees it
        t.join(20)
        want = b"HTTP/1.0 408" if phase == "body" else b""
        assert answer and answer[0].startswith(want), answer
        with socket.create_connection(addr, timeout=30) as s:  # the next client is served
            s.sendall(f"GET /api/state HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert s.recv(65536).startswith(b"HTTP/1.0 200")
    finally:
        stop.set()
        srv.shutdown()
        srv.server_close()
    assert capsys.readouterr().err == ""


def _served(timeout, max_connections=1):
    from gpt.explain import prompt_tokenizer
    from gpt.explain.serve.server import make_server
    from gpt.explain.steps import Session

    prompt = "The capital of France is Paris"
    tok = prompt_tokenizer(prompt)
    tg.manual_seed(0)
    model = GPT(GPTConfig.from_preset("tiny", vocab_size=tok.vocab_size))
    srv = make_server(Session(model, tok, prompt), max_connections=max_connections, timeout=timeout)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_a_refused_client_trickling_after_the_answer_is_dropped_at_the_deadline(capsys):
    """After the answer the server reads what the client still sends, so that closing does not
    reset the connection; that drain has one deadline too, not one per read: a refused client
    sending a byte every 0.5 s (each read in time) does not keep its slot for 16 reads."""
    srv = _served(timeout=0.5)
    addr = srv.server_address[:2]
    host = f"127.0.0.1:{addr[1]}"
    stop = threading.Event()
    answer = []

    def trickle():
        with socket.create_connection(addr, timeout=30) as s:
            try:
                s.sendall(
                    f"POST /api/step HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: 60000\r\n\r\n".encode()
                )
                answer.append(s.recv(65536))  # 415, then keep trickling the body
                for _ in range(100):
                    if stop.is_set():
                        break
                    s.sendall(b"x")
                    time.sleep(0.5)
            except OSError:
                pass  # the server closed on us

    t = threading.Thread(target=trickle, daemon=True)
    try:
        t.start()
        while srv.open == 0 and t.is_alive():
            time.sleep(0.01)
        assert srv.wait_idle(5)  # not 16 reads of 0.5 s (8 s) or more
        assert answer and answer[0].startswith(b"HTTP/1.0 415"), answer
        with socket.create_connection(addr, timeout=30) as s:  # the next client is served
            s.sendall(f"GET /api/state HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert s.recv(65536).startswith(b"HTTP/1.0 200")
    finally:
        stop.set()
        srv.shutdown()
        srv.server_close()
    assert capsys.readouterr().err == ""


def test_a_request_line_without_a_version_is_answered_400_at_once(capsys):
    """``GET /`` alone (HTTP/0.9) is refused at once, not read for headers until the deadline."""
    srv = _served(timeout=60)
    addr = srv.server_address[:2]
    try:
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"GET /\r\n")
            data = b""
            while chunk := s.recv(65536):  # headers and body may come in separate reads
                data += chunk
        assert data.startswith(b"HTTP/1.0 400"), data
        assert b'"error"' in data and b"HTTP/0.9" in data
    finally:
        srv.shutdown()
        srv.server_close()
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- round 4
def not_regular(tmp_path) -> dict:
    """Things that exist and are not regular files, under tmp_path only: a FIFO, a directory,
    and (as root) a character device like /dev/null."""
    import stat

    nodes = {"fifo": tmp_path / "fifo.png", "dir": tmp_path / "dir.png"}
    os.mkfifo(nodes["fifo"])
    nodes["dir"].mkdir()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        nodes["chardev"] = tmp_path / "null.png"
        os.mknod(nodes["chardev"], stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return nodes


def test_gpt_plot_never_replaces_an_output_that_is_not_a_regular_file(tmp_path, capsys):
    write_metrics(tmp_path, ['{"iter": 0, "loss": 3.0}'])
    for kind, p in not_regular(tmp_path).items():
        before = os.lstat(p).st_mode
        assert plot.main([str(tmp_path), "--output", str(p)]) == 2, kind
        err = one_line(capsys.readouterr().err)
        assert "not a regular file" in err or (kind == "dir" and "is a directory" in err), err
        assert os.lstat(p).st_mode == before, kind


@pytest.mark.parametrize("where", ["long", "file_parent"])
def test_gpt_plot_output_that_cannot_be_a_file_is_one_line(tmp_path, capsys, where):
    write_metrics(tmp_path, ['{"iter": 0, "loss": 3.0}'])
    (tmp_path / "file").write_text("mine")
    out = tmp_path / ("a" * 300 + ".png") if where == "long" else tmp_path / "file" / "x.png"
    assert plot.main([str(tmp_path), "--output", str(out)]) in (1, 2)
    err = one_line(capsys.readouterr().err)
    assert ("too long" in err) if where == "long" else ("not a directory" in err), err
    assert (tmp_path / "file").read_text() == "mine"


@pytest.mark.parametrize("kind", ["fifo", "dir", "link_to_fifo"])
def test_gpt_plot_metrics_that_is_not_a_regular_file_is_one_line(tmp_path, capsys, kind):
    m = tmp_path / "metrics.jsonl"
    if kind == "fifo":
        os.mkfifo(m)
    elif kind == "dir":
        m.mkdir()
    else:
        os.mkfifo(tmp_path / "pipe")
        os.symlink(tmp_path / "pipe", m)
    assert plot.main([str(tmp_path)]) == 2
    assert "is not a regular file" in one_line(capsys.readouterr().err)


def test_gpt_plot_skips_rows_with_numbers_too_big_for_a_float(tmp_path):
    big = 10**400
    rows = [
        f'{{"iter": {2**1100}, "loss": 1.0}}',
        f'{{"iter": {"9" * 400}, "loss": 1.0}}',
        f'{{"iter": 3, "loss": {big}}}',
        f'{{"iter": 4, "train_loss": {big}, "val_loss": 1.0}}',
        f'{{"iter": 5, "diag": {{"update_ratio": {{"h": {big}}}, "grad_norm": {{}}}}}}',
        '{"iter": 6, "loss": 2.0}',
    ]
    write_metrics(tmp_path, rows)
    got = plot.read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iter"] for r in got] == [5, 6] and got[0]["diag"]["update_ratio"] == {}


def test_gpt_plot_reads_a_huge_metrics_file_in_bounded_memory(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.setattr(plot, "MAX_LINE_BYTES", 1 << 16)
    monkeypatch.setattr(plot, "MAX_ROWS", 64)
    with open(tmp_path / "metrics.jsonl", "wb") as f:
        f.write(b"".join(b'{"iter": %d, "loss": 1.5}\n' % i for i in range(1000)))
        f.write(b"\0" * (8 << 20))  # a long NUL tail without a newline, as after a crash
        f.write(b'\n{"iter": 1000, "loss": 1.0}\n')
    tracemalloc.start()
    try:
        got = plot.read_metrics(tmp_path / "metrics.jsonl")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, peak
    assert 16 <= len(got) <= 64 and got[0]["iter"] == 0 and got[-1]["iter"] == 1000


def test_a_huge_token_in_merges_txt_is_cut_in_the_message(tmp_path):
    BPETokenizer.train("abc abd abe", 260).save(tmp_path)
    merges = (tmp_path / "merges.txt").read_text()
    (tmp_path / "merges.txt").write_text(merges + "x" * 100_000 + " y\n")
    with pytest.raises(ValueError) as e:
        load_tokenizer_dir(tmp_path)
    assert len(str(e.value)) < 400 and "\n" not in str(e.value), str(e.value)[:500]


def test_from_pretrained_refuses_the_empty_name(tmp_path, monkeypatch):
    from gpt.hub import HubError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(HubError, match="''"):
        GPT.from_pretrained("")


def test_gpt_explain_prompt_that_is_not_utf8_is_one_line(capsys):
    from gpt.explain import main

    prompt = b"\xed\xa0\x80abc".decode("utf-8", "surrogateescape")  # as sys.argv holds it
    with pytest.raises(SystemExit) as e:
        main(["--prompt", prompt, "--format", "json", "--checks", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--prompt" in err and "UTF-8" in err and "could not load" not in err


@pytest.mark.parametrize("names", [["metrics.jsonl"], ["loss.png"], ["metrics.jsonl", "loss.png"]])
def test_gpt_train_never_overwrites_a_users_metrics_or_plot(tmp_path, monkeypatch, capsys, names):
    monkeypatch.setenv("GPT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "mine"
    out.mkdir()
    for n in names:
        (out / n).write_text(f"my {n}")
    corpus = tmp_path / "c.txt"
    corpus.write_text("abc de " * 400)
    args = ["--data", str(corpus), "--out-dir", str(out), "--max-iters", "1", "--no-sample"]
    assert train.main([*args, "--block-size", "8", "--n-layer", "1", "--n-embd", "16"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--overwrite" in err and names[0] in err, err
    assert all((out / n).read_text() == f"my {n}" for n in names)
