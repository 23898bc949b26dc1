"""gpt-train --data DIR on pre-tokenized shards: build-nanogpt's fineweb .npy and llm.c's .bin.

The shards are written here, small: a val shard and three train shards cut from one stream,
with a GPT-2-format tokenizer of 257 ids (256 bytes + <|endoftext|>) beside them, so nothing
needs the network. Each stream steps by a fixed amount mod 257 (train by 7, val by 11), so a
window drawn from it shows where it came from: consecutive tokens of its own split's stream.
Every bad shard is one line (exit 1, 2 for a bad flag) naming the file and its problem.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from test_train import TINY

from gpt import shards, train
from gpt.data import BatchSampler, DataError
from gpt.hub import HubError
from gpt.store import run_checkpoint as rc
from gpt.tokenizer import BPETokenizer

V = 257
STEP = {"train": 7, "val": 11}
TRAIN_CUTS = (0, 400, 900, 1500)  # three train shards of 400, 500 and 600 tokens
N_VAL = 300
TIMES = ("tokens_per_s", "elapsed_s")  # the only fields of metrics.jsonl that may differ


def stream(split: str, n: int) -> np.ndarray:
    return (np.arange(n) * STEP[split] % V).astype(np.uint16)


def write_bin(path: Path, ids, magic=20240520, version=1, count=None, extra=b"") -> None:
    """An llm.c token file: 256 int32 (magic, version, count), then the uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, len(ids) if count is None else count
    path.write_bytes(header.tobytes() + np.asarray(ids, dtype="<u2").tobytes() + extra)


def names(fmt: str) -> tuple[str, list[str]]:
    """(val shard, train shards) as fineweb.py and llm.c's fineweb.py name them."""
    if fmt == "npy":
        return "edufineweb_val_000000.npy", [f"edufineweb_train_{i:06d}.npy" for i in (1, 2, 3)]
    return "fineweb_val_000000.bin", [f"fineweb_train_{i:06d}.bin" for i in (1, 2, 3)]


def write(path: Path, ids) -> None:
    if path.suffix == ".npy":
        np.save(path, np.asarray(ids, dtype=np.uint16))
    else:
        write_bin(path, ids)


def shard_dir(root: Path, fmt: str) -> Path:
    """A folder of shards in format fmt ('npy' or 'bin') and the tokenizer files."""
    root.mkdir()
    BPETokenizer.train("", V).save(root)
    val, trains = names(fmt)
    write(root / val, stream("val", N_VAL))
    train_ids = stream("train", TRAIN_CUTS[-1])
    for name, a, b in zip(trains, TRAIN_CUTS, TRAIN_CUTS[1:]):
        write(root / name, train_ids[a:b])
    return root


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT_CACHE_DIR", str(tmp_path / "cache"))


def gpt_train(data, out, *args) -> int:
    return train.main(["--data", str(data), "--out-dir", str(out), *TINY, *args])


def records(out: Path) -> list:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMES} for line in lines]


def assert_from_stream(x: np.ndarray, y: np.ndarray, split: str) -> None:
    """y is x shifted by one, and every row is consecutive tokens of the split's stream."""
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    windows = np.concatenate([x, y[:, -1:]], axis=1)
    steps = np.diff(windows, axis=1) % V
    assert (steps == STEP[split]).all(), f"a {split} window is not from the {split} shards"


@pytest.mark.parametrize("fmt", ["npy", "bin"])
def test_gpt_train_trains_on_shards_and_draws_from_them(fmt, tmp_path, monkeypatch, capsys):
    data = shard_dir(tmp_path / fmt, fmt)
    drawn = []
    real = shards.ShardSampler.next_batch

    def recording(self):
        x, y = real(self)
        drawn.append((self.split, x, y))
        return x, y

    monkeypatch.setattr(shards.ShardSampler, "next_batch", recording)
    out = tmp_path / "run"
    assert gpt_train(data, out, "--max-iters", "3", "--eval-interval", "3") == 0
    err = capsys.readouterr().err
    assert f"data: 1,500 train / 300 val tokens, bpe vocabulary of {V} ({data})" in err
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["iter"] == 3 and ckpt["data"]["dir"] == str(data)
    assert len([r for r in records(out) if "loss" in r]) == 3
    assert {s for s, _, _ in drawn} == {"train", "val"}
    for split, x, y in drawn:
        assert x.shape == y.shape == (4, 16) and x.dtype == np.int64
        assert_from_stream(x, y, split)


def test_windows_run_through_the_shards_in_order(tmp_path):
    """Three train shards (and an empty one) are one stream; windows start anywhere in it
    and run from one shard into the next; the val sampler reads only the val shard."""
    d = tmp_path / "d"
    d.mkdir()
    ids = np.arange(1500, dtype=np.uint16)  # a token is its position in the stream
    for name, a, b in [
        ("a_train.bin", 0, 400),
        ("b_train.bin", 400, 900),
        ("c_train.bin", 900, 900),
    ]:
        write_bin(d / name, ids[a:b])
    write_bin(d / "d_train.bin", ids[900:])
    write_bin(d / "val.bin", 40000 + np.arange(100, dtype=np.uint16))
    meta = shards.check_shards(d, shards.shard_files(d), vocab_size=1 << 16)
    assert (meta["train_tokens"], meta["val_tokens"]) == (1500, 100)
    assert meta["n_shards"] == {"train": 4, "val": 1}
    sampler = shards.ShardSampler(meta["shards"]["train"], "train", 16, 8, seed=3)
    starts = []
    for _ in range(300):
        x, y = sampler.next_batch()
        np.testing.assert_array_equal(x, x[:, :1] + np.arange(16))
        np.testing.assert_array_equal(y, x + 1)
        starts += list(x[:, 0])
    starts = np.array(starts)
    assert starts.min() >= 0 and starts.max() <= 1500 - 17
    for boundary in (400, 900):  # windows that run across it
        assert ((starts < boundary) & (starts + 16 >= boundary)).any(), boundary
    val = shards.ShardSampler(meta["shards"]["val"], "val", 16, 8, seed=3)
    x, _ = val.next_batch()
    assert (x >= 40000).all() and (x < 40100).all()


def test_one_shard_draws_what_batch_sampler_draws(tmp_path):
    """The same tokens as a prepared train.bin and as one llm.c shard: the same batches from
    the same seed, the same generator state, and a restored state draws them again."""
    ids = stream("train", 700)
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "train.bin").write_bytes(ids.tobytes())
    (prepared / "meta.json").write_text(json.dumps({"dtype": "uint16"}))
    d = tmp_path / "shards"
    d.mkdir()
    write_bin(d / "x_train.bin", ids)
    write_bin(d / "x_val.bin", ids[:50])
    meta = shards.check_shards(d, shards.shard_files(d), vocab_size=V)
    a = BatchSampler(prepared, "train", 16, 4, seed=5)
    b = shards.make_sampler(d, meta, "train", 16, 4, seed=5)
    assert isinstance(b, shards.ShardSampler)
    for _ in range(3):
        for u, v in zip(a.next_batch(), b.next_batch()):
            np.testing.assert_array_equal(u, v)
    state = b.state_dict()
    assert state == a.state_dict()
    later = [b.next_batch() for _ in range(2)]
    b.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    for u, v in zip(later, [b.next_batch() for _ in range(2)]):
        np.testing.assert_array_equal(u[0], v[0])


@pytest.mark.parametrize("fmt", ["npy", "bin"])
def test_resume_on_shards_is_bitwise(fmt, tmp_path):
    """6 iterations, or 3 and --resume to 6: the same metrics.jsonl (times aside), weights."""
    data = shard_dir(tmp_path / fmt, fmt)
    sched = ["--eval-interval", "3", "--lr-decay-iters", "6"]
    full, split = tmp_path / "full", tmp_path / "split"
    assert gpt_train(data, full, "--max-iters", "6", *sched) == 0
    assert gpt_train(data, split, "--max-iters", "3", *sched) == 0
    assert train.main(["--resume", "--out-dir", str(split), "--max-iters", "6"]) == 0
    a, b = records(full), records(split)
    assert len(a) == len(b) and [r["iter"] for r in b if "loss" in r] == list(range(6))
    for ra, rb in zip(a, b):
        assert ra == rb, f"iter {ra.get('iter')}: {ra} != {rb}"
    _, wa, _ = rc.load(full)
    _, wb, _ = rc.load(split)
    for name in wa:
        np.testing.assert_array_equal(wa[name], wb[name], err_msg=name)


def test_resume_refuses_changed_shards(tmp_path, capsys):
    data = shard_dir(tmp_path / "bin", "bin")
    out = tmp_path / "run"
    assert gpt_train(data, out, "--max-iters", "3", "--eval-interval", "3") == 0
    write(data / names("bin")[1][2], stream("train", 600)[::-1].copy())  # same size, new ids
    capsys.readouterr()
    assert train.main(["--resume", "--out-dir", str(out), "--max-iters", "6"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training text or its tokenizer changed" in err


# ----------------------------------------------------------------------------- bad shards
class Unpickled:
    """Unpickling this makes a folder: the object-dtype .npy case shows nothing was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def npy_with_header(path: Path, shape, descr="<u2", body=b"\0" * 64) -> None:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": descr, "fortran_order": False, "shape": shape}
        )
        f.write(body)


def put(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _val(d, fmt="bin"):
    return d / names(fmt)[0]


def _train(d, fmt="bin", i=0):
    return d / names(fmt)[1][i]


# name: (format, edit of the good folder -> the file or folder the line names (None: no file),
# words of the line, exit status)
CASES = {
    "empty folder": (
        "bin",
        lambda d: [p.unlink() for p in d.iterdir()] and d,
        "holds no .txt files to read, nor .npy/.bin token shards",
        1,
    ),
    "a mix of .npy and .bin": (
        "bin",
        lambda d: np.save(d / "extra_train.npy", stream("train", 50)) or d,
        "holds both .npy shards (extra_train.npy) and .bin shards",
        1,
    ),
    "wrong magic": (
        "bin",
        lambda d: write_bin(_train(d), stream("train", 400), magic=12345) or _train(d),
        "starts with magic 12345, not llm.c's 20240520",
        1,
    ),
    "llama 3 magic": (
        "bin",
        lambda d: write_bin(_val(d), [1, 2, 3], magic=20240801, version=7) or _val(d),
        "Llama 3",
        1,
    ),
    "unknown version": (
        "bin",
        lambda d: write_bin(_train(d), stream("train", 400), version=2) or _train(d),
        "is version 2 of llm.c's format; gpt-train reads version 1",
        1,
    ),
    "count larger than the file": (
        "bin",
        lambda d: write_bin(_train(d), stream("train", 400), count=2**31 - 1) or _train(d),
        "is truncated: its header says 2,147,483,647 tokens",
        1,
    ),
    "count smaller than the file": (
        "bin",
        lambda d: write_bin(_train(d), stream("train", 400), count=300) or _train(d),
        "has 200 bytes after the 300 tokens its header says",
        1,
    ),
    "shorter than the header": (
        "bin",
        lambda d: put(_val(d), b"\0" * 100),
        "has 100 bytes, fewer than llm.c's 1024-byte header",
        1,
    ),
    "npy of int32": (
        "npy",
        lambda d: (
            np.save(_train(d, "npy"), stream("train", 400).astype(np.int32)) or _train(d, "npy")
        ),
        "holds int32 values; a fineweb shard is a 1-D uint16 array",
        1,
    ),
    "npy of 2 dimensions": (
        "npy",
        lambda d: (
            np.save(_train(d, "npy"), stream("train", 400).reshape(20, 20)) or _train(d, "npy")
        ),
        "holds a 2-D array of shape (20, 20)",
        1,
    ),
    "npy of objects (a pickle)": (
        "npy",
        lambda d: (
            np.save(
                _val(d, "npy"), np.array([Unpickled(d.parent / "unpickled")]), allow_pickle=True
            )
            or _val(d, "npy")
        ),
        "holds object values",
        1,
    ),
    "npy truncated": (
        "npy",
        lambda d: npy_with_header(_train(d, "npy"), (10**12,)) or _train(d, "npy"),
        "is truncated: its header says 1,000,000,000,000 tokens",
        1,
    ),
    "npy with bytes after its array": (
        "npy",
        lambda d: npy_with_header(_train(d, "npy"), (30,)) or _train(d, "npy"),
        "has 4 bytes after the 30 tokens its header says",
        1,
    ),
    "not an npy": (
        "npy",
        lambda d: put(_val(d, "npy"), b"PK\3\4 a zip"),
        "is not a readable .npy file",
        1,
    ),
    "id outside the vocabulary": (
        "npy",
        lambda d: (
            np.save(_train(d, "npy", 2), np.r_[stream("train", 100), 300, 5].astype("u2"))
            or _train(d, "npy", 2)
        ),
        f"token 100 is id 300, outside the vocabulary of {V} tokens",
        1,
    ),
    "no val shard": ("bin", lambda d: _val(d).unlink() or d, "but no val shard", 1),
    "no train shard": (
        "npy",
        lambda d: [_train(d, "npy", i).unlink() for i in range(3)] and d,
        "has 1 val shard(s) but no train shard",
        1,
    ),
    "a name without its split": (
        "bin",
        lambda d: write_bin(d / "fineweb_000009.bin", [1, 2]) or d / "fineweb_000009.bin",
        "the name holds neither 'train' nor 'val'",
        1,
    ),
    "a shard instead of its folder": (
        "bin",
        lambda d: _train(d),
        "is a llm.c .bin token shard: pass the folder that holds the shards",
        1,
    ),
    "val shorter than a block": (
        "bin",
        lambda d: write_bin(_val(d), [1, 2, 3]),  # (the existing line, naming no file)
        "block size 16 is larger than the data can fill: the val split has 3 tokens",
        2,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_each_bad_shard_is_one_line(case, tmp_path, capsys):
    fmt, edit, words, code = CASES[case]
    good = shard_dir(tmp_path / "shards", fmt)
    named = edit(good)
    data = named if case == "a shard instead of its folder" else good
    got = gpt_train(data, tmp_path / "out", "--max-iters", "1")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("gpt-train: error: "), err
    assert got == code and words in err, err
    if named is not None:  # the file (or folder) at fault
        assert str(named) in err, err
    assert not (tmp_path / "out" / "ckpt.json").exists()
    assert not (tmp_path / "unpickled").exists()


def test_no_tokenizer_and_no_hub_is_one_line(tmp_path, monkeypatch, capsys):
    """Without vocab.json + merges.txt beside the shards, GPT-2's come from the hub's gpt2;
    where that fails the line says what to do."""
    data = shard_dir(tmp_path / "shards", "npy")
    (data / "vocab.json").unlink()

    def no_hub(name):
        raise HubError(f"{name} is not a local directory, and fetching it needs huggingface_hub")

    monkeypatch.setattr("gpt.hub.tokenizer_dir", no_hub)
    assert gpt_train(data, tmp_path / "out", "--max-iters", "1") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{data} holds GPT-2 token ids but not GPT-2's tokenizer" in err
    assert "needs huggingface_hub" in err and "--init-from" in err


def test_vocab_size_does_not_apply_to_shards(tmp_path, capsys):
    data = shard_dir(tmp_path / "shards", "bin")
    args = ["--tokenizer", "bpe", "--vocab-size", "300", "--max-iters", "1"]
    assert gpt_train(data, tmp_path / "out", *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--vocab-size does not apply to token shards" in err


def test_ids_are_checked_in_chunks(tmp_path, monkeypatch):
    """The id check reads a shard in CHUNK_TOKENS pieces and finds a bad id in a later one."""
    monkeypatch.setattr(shards, "CHUNK_TOKENS", 64)
    d = shard_dir(tmp_path / "shards", "bin")
    ids = stream("train", 400)
    ids[333] = 999
    write_bin(_train(d), ids)
    with pytest.raises(DataError, match="token 333 is id 999"):
        shards.check_shards(d, shards.shard_files(d), V)
