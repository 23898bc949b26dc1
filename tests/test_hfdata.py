"""gpt-train --data hf:NAME[:CONFIG][@SIZE]: a Hugging Face dataset's text, streamed once.

Most tests stand a small fake `datasets` module in for the library (its `load_dataset` yields
records as the streaming mode does), so they run without it and without the network; the
last ones use the real library, when it is installed, on a local folder of .jsonl records.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest
from test_train import TINY

from gpt import hfdata, train
from gpt.data import DataError
from gpt.train.config import run_name

STORIES = [f"Story {i}: once upon a time there was a cat number {i}." for i in range(200)]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT_CACHE_DIR", str(tmp_path / "cache"))


class Stream:
    """What `load_dataset(..., streaming=True)` returns: column names, records one by one."""

    def __init__(self, records, fail_at=None):
        self.records, self.fail_at = records, fail_at
        self.column_names = list(records[0]) if records else ["text"]
        self.read = 0

    def __iter__(self):
        for i, r in enumerate(self.records):
            if i == self.fail_at:
                raise ConnectionError("the connection dropped")
            self.read += 1
            yield r


def fake_datasets(monkeypatch, stream=None, error=None) -> list:
    """Install a fake `datasets`; returns the list of (name, config, kwargs) it was asked."""
    calls = []

    def load_dataset(name, config=None, **kw):
        calls.append((name, config, kw))
        if error is not None:
            raise error
        return stream

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def stories():
    return Stream([{"text": t, "id": i} for i, t in enumerate(STORIES)])


def test_the_train_split_is_streamed_into_one_text_file(tmp_path, monkeypatch):
    calls = fake_datasets(monkeypatch, stories())
    path = hfdata.text_file("hf:org/stories:small", tmp_path)
    assert calls == [("org/stories", "small", {"split": "train", "streaming": True})]
    assert path.read_text(encoding="utf-8") == "\n\n".join(STORIES)
    meta = json.loads((path.parent / "source.json").read_text())
    assert meta["records"] == len(STORIES) and meta["spec"] == "hf:org/stories:small"
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".partial")] == []


def test_a_size_stops_the_stream_at_the_record_that_crosses_it(tmp_path, monkeypatch):
    s = stories()
    fake_datasets(monkeypatch, s)
    text = hfdata.text_file("hf:org/stories@1KB", tmp_path).read_text()
    n = len(text.split("\n\n"))
    assert len(text) >= 1000 > len("\n\n".join(STORIES[: n - 1]))
    assert s.read == n < len(STORIES)  # nothing past the record that crossed 1 KB was read


def test_a_streamed_spec_is_read_from_the_cache_without_the_library(tmp_path, monkeypatch):
    fake_datasets(monkeypatch, stories())
    first = hfdata.text_file("hf:org/stories", tmp_path).read_text()
    monkeypatch.setitem(sys.modules, "datasets", None)  # now `import datasets` fails
    assert hfdata.text_file("hf:org/stories", tmp_path).read_text() == first


def test_a_stream_that_fails_midway_leaves_nothing_that_counts_as_streamed(tmp_path, monkeypatch):
    broken = Stream([{"text": t} for t in STORIES], fail_at=50)
    fake_datasets(monkeypatch, broken)
    with pytest.raises(DataError, match="Cannot stream 'org/stories' into .*connection dropped"):
        hfdata.text_file("hf:org/stories", tmp_path)
    folder = hfdata.cache_path("hf:org/stories", tmp_path).parent
    assert list(folder.iterdir()) == []
    fake_datasets(monkeypatch, stories())  # a later run streams it afresh, whole
    assert hfdata.text_file("hf:org/stories", tmp_path).read_text() == "\n\n".join(STORIES)


def test_empty_null_and_nul_records_are_skipped_and_counted(tmp_path, monkeypatch, capsys):
    texts = ["a", "", "b\x00c", None, "d"]
    fake_datasets(monkeypatch, Stream([{"text": t} for t in texts]))
    assert hfdata.text_file("hf:org/x", tmp_path).read_text() == "a\n\nd"
    assert "skipped 3 empty, null or NUL-holding records" in capsys.readouterr().err


def test_a_signal_while_streaming_stays_a_signal(tmp_path, monkeypatch):
    """gpt-train's SIGINT/SIGTERM handler raises Interrupted: not a data problem (exit 130/143)."""
    from gpt.train.signals import Interrupted

    class Killed(Stream):
        def __iter__(self):
            yield {"text": "a"}
            raise Interrupted(15)

    fake_datasets(monkeypatch, Killed([{"text": "a"}]))
    with pytest.raises(Interrupted):
        hfdata.text_file("hf:org/x", tmp_path)
    assert list(hfdata.cache_path("hf:org/x", tmp_path).parent.iterdir()) == []


def test_a_killed_streams_partial_file_is_removed_by_the_next(tmp_path, monkeypatch):
    folder = hfdata.cache_path("hf:org/x", tmp_path).parent
    folder.mkdir(parents=True)
    dead = folder / ".text.txt.999999999.partial"  # a pid no system has
    alive = folder / f".text.txt.{os.getppid()}.partial"  # a stream running now
    dead.write_text("half"), alive.write_text("half")
    fake_datasets(monkeypatch, stories())
    hfdata.text_file("hf:org/x", tmp_path)
    assert not dead.exists() and alive.exists()


def test_the_spellings_of_one_size_share_a_cache_folder(tmp_path):
    spellings = ("hf:x@4KB", "hf:x@4kb", "hf:x@4000", "hf:x@ 4 KB")
    assert len({hfdata.cache_path(s, tmp_path) for s in spellings}) == 1
    assert hfdata.cache_path("hf:x@4KB", tmp_path) != hfdata.cache_path("hf:x@5KB", tmp_path)


@pytest.mark.parametrize(
    "a, b", [("hf:org/data@1.5GB", "hf:org/data@1.2GB"), ("hf:org/data.v2", "hf:org/data.v3")]
)
def test_runs_on_other_data_get_other_default_folders(a, b):
    assert run_name({"data": a, "tokenizer": "char"}) != run_name({"data": b, "tokenizer": "char"})
    assert run_name({"data": "hf:org/stories@200MB", "tokenizer": "bpe"}) == "stories-200MB-bpe"


@pytest.mark.parametrize(
    "records, error, message",
    [
        ([{"content": "a"}], None, "'org/x' has no 'text' column (its columns: content)"),
        ([{"text": 3}], None, "record 0 of 'org/x' has no text (its 'text' field is int)"),
        ([], None, "'org/x' streamed no text"),
        (None, ConnectionError("Couldn't reach 'org/x' on the Hub (OfflineModeIsEnabled)\nmore"),
         "Cannot stream 'org/x' from the Hugging Face hub: Couldn't reach 'org/x' on the Hub"),
        (None, ValueError("BuilderConfig 'nope' not found. Available: ['default']"),
         "BuilderConfig 'nope' not found"),
    ],
)  # fmt: skip
def test_each_dataset_problem_is_one_line(records, error, message, tmp_path, monkeypatch):
    fake_datasets(monkeypatch, None if records is None else Stream(records), error)
    with pytest.raises(DataError) as e:
        hfdata.text_file("hf:org/x", tmp_path)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not hfdata.cache_path("hf:org/x", tmp_path).exists()


def test_without_the_library_the_line_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match="not installed: pip install datasets"):
        hfdata.text_file("hf:org/x", tmp_path)


@pytest.mark.parametrize(
    "spec, want",
    [
        ("hf:roneneldan/TinyStories", ("roneneldan/TinyStories", None, None)),
        ("hf:HuggingFaceFW/fineweb-edu:sample-10BT@1GB", ("HuggingFaceFW/fineweb-edu", "sample-10BT", 10**9)),
        ("hf:x@200MB", ("x", None, 200 * 10**6)),
        ("hf:x@1.5k", ("x", None, 1500)),
    ],
)  # fmt: skip
def test_specs_parse(spec, want):
    assert hfdata.parse(spec) == want


@pytest.mark.parametrize(
    "spec",
    ["hf:", "hf:x@", "hf:x@0MB", "hf:x@0.5", "hf:x@12TB", "hf:a:b:c", "hf:x@1@2", "hf:x @1KB",
     "hf: x", "hf:x: @1KB"],
)  # fmt: skip
def test_a_bad_spec_is_refused_before_any_work(spec, tmp_path, capsys):
    assert train.main(["--data", spec, "--out-dir", str(tmp_path / "o"), *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "is not hf:NAME[:CONFIG][@SIZE]" in err or "the size after @ must be like" in err


def test_gpt_train_trains_on_a_streamed_dataset_and_resumes_bitwise(tmp_path, monkeypatch):
    fake_datasets(monkeypatch, stories())
    full, split = tmp_path / "full", tmp_path / "split"
    run = ["--data", "hf:org/stories", *TINY, "--eval-interval", "3", "--lr-decay-iters", "6"]
    assert train.main([*run, "--out-dir", str(full), "--max-iters", "6"]) == 0
    ckpt = json.loads((full / "ckpt.json").read_text())
    assert ckpt["train_config"]["data"] == "hf:org/stories"
    monkeypatch.setitem(sys.modules, "datasets", None)  # the cache is enough from now on
    assert train.main([*run, "--out-dir", str(split), "--max-iters", "3"]) == 0
    assert train.main(["--resume", "--out-dir", str(split), "--max-iters", "6"]) == 0
    a, b = ((d / "metrics.jsonl").read_text().splitlines() for d in (full, split))
    drop = ("tokens_per_s", "elapsed_s")
    strip = [[{k: v for k, v in json.loads(x).items() if k not in drop} for x in r] for r in (a, b)]
    assert strip[0] == strip[1]


# ----------------------------------------------------------------------------- the real library
def jsonl_folder(root: Path) -> Path:
    root.mkdir()
    with open(root / "train.jsonl", "w") as f:
        for t in STORIES:
            f.write(json.dumps({"text": t}) + "\n")
    return root


def test_the_real_library_streams_a_local_folder(tmp_path, monkeypatch):
    pytest.importorskip("datasets", reason="pip install datasets to run it with the real library")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hfcache"))
    folder = jsonl_folder(tmp_path / "stories")
    text = hfdata.text_file(f"hf:{folder}@2KB", tmp_path / "cache").read_text()
    assert text == "\n\n".join(STORIES[: len(text.split("\n\n"))]) and len(text) >= 2000
    out = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # a relative folder is made absolute, for --resume elsewhere
    argv = ["--data", "hf:stories", "--out-dir", str(out), *TINY, "--max-iters", "2"]
    assert train.main(argv) == 0
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["train_config"]["data"] == f"hf:{folder}"
