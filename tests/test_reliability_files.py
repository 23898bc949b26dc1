"""Hostile files and data-loading arguments (issue 34): tensorgrad.save/load refuse what they
did not write with one clear line, in bounded memory, and round-trip 0-d tensors; a GPT-2
directory's skipped buffers are bounded and never read; DataLoader collates and validates as
PyTorch does, and no sampler loops forever."""

import itertools
import json
import os
import re
import signal
import stat
import struct
import tracemalloc
from contextlib import contextmanager

import numpy as np
import pytest

import tensorgrad as tg
from gpt.model import GPT
from gpt.store.errors import CheckpointError
from tensorgrad.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
    random_split,
)

REFUSED = r"^load: .*(not a tensorgrad file|corrupt)"
TORCH = "torch is not installed: pip install -e '.[hf]' (or pip install torch==2.13.0)"


@contextmanager
def no_hang(seconds=20):
    """Turn a hang (the bug these tests guard against) into a failure instead of a stuck run."""

    def on_alarm(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: it hangs")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def refused(path):
    """tg.load(path) fails with one ValueError line saying the file is not tensorgrad's."""
    with no_hang(), pytest.raises(ValueError, match=REFUSED) as e:
        tg.load(path)
    assert "\n" not in str(e.value)
    return str(e.value)


def st_file(path, header, data=b"", metadata=None):
    """A safetensors-shaped file from a header (a dict, or raw bytes) and data bytes."""
    if isinstance(header, dict):
        if metadata is not None:
            header = {"__metadata__": metadata, **header}
        header = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    return path


def tg_file(path, tree, header=None, data=b""):
    """A file like tg.save's whose tensorgrad.json tree (or raw string) is given."""
    meta = {"tensorgrad.json": tree if isinstance(tree, str) else json.dumps(tree)}
    return st_file(path, header or {}, data, meta)


# ----------------------------------------------------------------------------- tensorgrad.load
def test_load_refuses_devices_and_fifos_without_reading_them(tmp_path):
    if os.path.exists("/dev/zero"):
        assert "not a regular file" in refused("/dev/zero")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "not a regular file" in refused(fifo)  # opening it must not wait for a writer
    with pytest.raises(IsADirectoryError):
        tg.load(tmp_path)


@pytest.mark.parametrize(
    "head",
    [
        b"",
        b"\x01",
        struct.pack("<Q", 2**63) + b"{}",  # a header length far past the file
        struct.pack("<Q", 5) + b"{}",
        struct.pack("<Q", 2) + b"[]",
        struct.pack("<Q", 2) + b"\xff\xfe",  # not UTF-8
        struct.pack("<Q", 4) + b"null",
    ],
)
def test_load_refuses_truncated_or_absurd_headers(tmp_path, head):
    (tmp_path / "f").write_bytes(head)
    refused(tmp_path / "f")


def test_load_refuses_torch_files(tmp_path):
    (tmp_path / "zip.pt").write_bytes(b"PK\x03\x04" + bytes(range(60)))
    (tmp_path / "pickle.pt").write_bytes(b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." + bytes(40))
    assert "torch.save" in refused(tmp_path / "zip.pt")
    assert "torch.save" in refused(tmp_path / "pickle.pt")
    torch = pytest.importorskip("torch", reason=TORCH)
    ckpt = {"model": {"w": torch.ones(2, 3)}, "best_val_loss": torch.tensor(1.5), "iter_num": 7}
    torch.save(ckpt, tmp_path / "new.pt")
    torch.save(ckpt, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert "torch.save" in refused(tmp_path / "new.pt")
    assert "torch.save" in refused(tmp_path / "old.pt")


A = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    "header",
    [
        {"a": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}},  # dtype not allowed
        {"a": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}},
        {"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}},
        {"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 8]}},  # huge shape
        {"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}},
        {"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}},
        {"a": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}},
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}},  # negative offsets
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}},  # a gap
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}},
        {"a": {"dtype": "F32", "shape": [2], "data_offsets": None}},
        {"a": {"dtype": "F32", "shape": [2]}},
        {"a": [1, 2]},
        {"a": A, "b": A},  # overlapping
        {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},  # 4 bytes left over
    ],
)
def test_load_refuses_malformed_tensor_entries(tmp_path, header):
    refused(tg_file(tmp_path / "f", {"a": {"__tensor__": "a"}}, header, bytes(8)))


@pytest.mark.parametrize(
    "tree",
    [
        {"x": {"__tensor__": "missing"}},
        {"x": {"__tensor__": 3}},
        {"x": {"__tensor__": ["a"]}},
        {"x": {"__tensor__": "a", "extra": 1}},
        {"x": {"__array__": None}},
        {"x": {"__tuple__": 3}},
        {"x": {"__tuple__": {"a": 1}}},
        {"x": {"__items__": 3}},
        {"x": {"__items__": [[1]]}},
        {"x": {"__items__": [[[1, 2], 3]]}},  # a list as a dict key
        {"x": {"__items__": [[{"k": 1}, 3]]}},
        {"x": {"__what__": 1}},
        pytest.param("[" * 100_000 + "]" * 100_000, id="deep-lists"),
        pytest.param('{"x": ' * 5000 + "1" + "}" * 5000, id="deep-dicts"),
        pytest.param("[" * 150 + "]" * 150, id="150-deep"),  # valid JSON, past MAX_DEPTH
        "{not json",
        pytest.param("1" * 5000, id="int-of-5000-digits"),
    ],
)
def test_load_refuses_malformed_trees(tmp_path, tree):
    refused(tg_file(tmp_path / "f", tree, {"a": A}, bytes(8)))


@pytest.mark.parametrize(
    "metadata",
    [None, {}, {"tensorgrad.json": 5}, {"tensorgrad.json": None}, [1], "x", {"other": "1"}],
)
def test_load_refuses_files_without_valid_metadata(tmp_path, metadata):
    head = {"a": A} if metadata is None else {"__metadata__": metadata, "a": A}
    refused(st_file(tmp_path / "f", head, bytes(8)))


def test_every_header_byte_flip_and_truncation_is_refused_in_one_line(tmp_path):
    good = tmp_path / "good"
    tg.save({"w": tg.ones(2, 3), "step": 3, "t": (1, "a"), 4: np.arange(3)}, good)
    data = good.read_bytes()
    n = 8 + int.from_bytes(data[:8], "little")
    bad = tmp_path / "bad"
    bad.write_bytes(data)
    fd = os.open(bad, os.O_RDWR)  # edited in place: rewriting the file each time is slow
    try:
        with no_hang():
            for i, v in itertools.product(range(n), (0x22, 0x7D, 0xFF)):
                os.pwrite(fd, bytes([v]), i)
                try:  # a flip inside a name or a number may load; anything else is refused
                    tg.load(bad)
                except ValueError as e:
                    assert re.match(REFUSED, str(e)) and "\n" not in str(e), (i, v, e)
                os.pwrite(fd, data[i : i + 1], i)
            for k in reversed(range(len(data))):
                os.ftruncate(fd, k)
                with pytest.raises(ValueError, match=REFUSED):
                    tg.load(bad)
    finally:
        os.close(fd)


def test_load_reads_only_the_arrays_the_tree_names(tmp_path):
    """An array the tree does not name is never read; the file still has to be well formed."""
    f = tg_file(tmp_path / "f", {"x": 1}, {"a": A}, bytes(8))
    assert tg.load(f) == {"x": 1}


def test_zero_dim_tensors_and_scalars_round_trip(tmp_path):
    obj = {
        "best_val_loss": tg.tensor(1.5),
        "iter": tg.tensor(3),
        "arr0": np.array(2.5, np.float16),
        "np32": np.float32(0.25),
        "np_i8": np.int8(-3),
        "np_bool": np.bool_(True),
        "py": (1.5, 2, True, None, "s"),
        "t1": tg.tensor([1.5]),
    }
    tg.save(obj, tmp_path / "ckpt.pt")
    back = tg.load(tmp_path / "ckpt.pt")
    assert isinstance(back["best_val_loss"], tg.Tensor) and back["best_val_loss"].shape == ()
    assert back["best_val_loss"].dtype == tg.float32 and back["best_val_loss"].item() == 1.5
    assert back["iter"].shape == () and back["iter"].dtype == tg.int64
    assert isinstance(back["arr0"], np.ndarray) and back["arr0"].shape == ()
    assert back["arr0"].dtype == np.float16 and back["arr0"] == 2.5
    for k in ("np32", "np_i8", "np_bool"):
        assert type(back[k]) is type(obj[k]) and back[k] == obj[k]
    assert back["py"] == (1.5, 2, True, None, "s")
    assert [type(v) for v in back["py"]] == [float, int, bool, type(None), str]
    assert back["t1"].shape == (1,)


def test_zero_dim_tensor_matches_torch(tmp_path):
    torch = pytest.importorskip("torch", reason=TORCH)
    torch.save({"best_val_loss": torch.tensor(1.5)}, tmp_path / "t.pt")
    want = torch.load(tmp_path / "t.pt")["best_val_loss"]
    tg.save({"best_val_loss": tg.tensor(1.5)}, tmp_path / "g.pt")
    got = tg.load(tmp_path / "g.pt")["best_val_loss"]
    assert tuple(got.shape) == tuple(want.shape) == () and got.item() == want.item()


def test_save_does_not_write_through_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    for name in ("ckpt.pt.tmp", ".ckpt.pt.tmp"):
        os.symlink(victim, tmp_path / name)
    tg.save({"w": tg.ones(3)}, tmp_path / "ckpt.pt")
    assert victim.read_text() == "keep me"
    assert tg.load(tmp_path / "ckpt.pt")["w"].tolist() == [1.0, 1.0, 1.0]
    assert not (tmp_path / "ckpt.pt").is_symlink()
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "ckpt.pt").st_mode) == 0o666 & ~umask  # as open()'s
    before = sorted(os.listdir(tmp_path))
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError):
        tg.save({"w": tg.ones(3)}, tmp_path / "dir")  # the target is a directory
    assert sorted(os.listdir(tmp_path)) == sorted([*before, "dir"])  # no temporary file left


def test_nesting_is_bounded_on_save_and_load(tmp_path):
    ok = [1]
    for _ in range(45):  # 91 containers deep
        ok = {"a": [ok]}
    tg.save(ok, tmp_path / "ok")
    assert tg.load(tmp_path / "ok") == ok
    deep = 1
    for _ in range(400):
        deep = [deep]
    with pytest.raises(ValueError, match="nested"):
        tg.save(deep, tmp_path / "deep")
    assert not (tmp_path / "deep").exists()


# ----------------------------------------------------------------------------- GPT-2 directories
N_LAYER, N_HEAD, C, BS, V = 2, 2, 8, 8, 16


def hf_arrays(bs=BS) -> dict:
    g = np.random.default_rng(0)
    r = lambda *s: g.standard_normal(s).astype(np.float32)  # noqa: E731
    w = {"wte.weight": r(V, C), "wpe.weight": r(bs, C), "ln_f.weight": r(C), "ln_f.bias": r(C)}
    for i in range(N_LAYER):
        h = f"h.{i}."
        w |= {h + "ln_1.weight": r(C), h + "ln_1.bias": r(C), h + "ln_2.weight": r(C)}
        w |= {h + "ln_2.bias": r(C), h + "attn.c_attn.weight": r(C, 3 * C)}
        w |= {h + "attn.c_attn.bias": r(3 * C), h + "attn.c_proj.weight": r(C, C)}
        w |= {h + "attn.c_proj.bias": r(C), h + "mlp.c_fc.weight": r(C, 4 * C)}
        w |= {h + "mlp.c_fc.bias": r(4 * C), h + "mlp.c_proj.weight": r(4 * C, C)}
        w |= {h + "mlp.c_proj.bias": r(C)}
    return w


def hf_dir(path, arrays, skipped=(), bs=BS):
    """A GPT-2 directory whose model.safetensors also holds `skipped` (name, dtype, shape)
    entries at its end, their bytes a hole in a sparse file (never written)."""
    path.mkdir()
    config = {"n_layer": N_LAYER, "n_head": N_HEAD, "n_embd": C, "n_positions": bs}
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": V}))
    header, blobs, pos = {}, [], 0
    for k, a in arrays.items():
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [pos, pos + a.nbytes]}
        blobs.append(a.tobytes())
        pos += a.nbytes
    sizes = {"F32": 4, "F64": 8, "BOOL": 1}
    for k, dtype, shape in skipped:
        end = pos + int(np.prod(shape)) * sizes.get(dtype, 4)
        header[k] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, end]}
        pos = end
    head = json.dumps(header).encode()
    f = path / "model.safetensors"
    with open(f, "wb") as out:
        out.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
        out.truncate(8 + len(head) + pos)
    return path


def test_a_huge_skipped_buffer_is_refused_before_reading(tmp_path):
    """A 256 MiB attn.bias (a hole in a sparse file) for a model whose mask is 8 x 8."""
    d = hf_dir(tmp_path / "m", hf_arrays(), [("h.0.attn.bias", "F32", (1, 1, 8192, 8192))])
    with no_hang(), pytest.raises(CheckpointError, match="attn.bias"):
        GPT.from_pretrained(d)


@pytest.mark.parametrize(
    "skipped",
    [
        ("h.1.attn.masked_bias", "F32", (2,)),  # a scalar in GPT-2
        ("h.1.attn.bias", "F32", (1, 1, BS + 1, BS)),
        ("h.1.attn.bias", "X9", (1, 1, BS, BS)),
    ],
)
def test_skipped_buffers_have_limits(tmp_path, skipped):
    with pytest.raises(CheckpointError, match="attn"):
        GPT.from_pretrained(hf_dir(tmp_path / "m", hf_arrays(), [skipped]))


def test_skipped_buffers_are_never_read(tmp_path):
    """Loading with GPT-2's mask buffers (1 MiB of float64 holes here, at a block size of 256)
    peaks no higher than loading without them."""
    bs = 256
    arrays = hf_arrays(bs)
    masks = [(f"h.{i}.attn.bias", "F64", (1, 1, bs, bs)) for i in range(N_LAYER)]
    masks += [(f"h.{i}.attn.masked_bias", "F32", ()) for i in range(N_LAYER)]
    plain = hf_dir(tmp_path / "a", arrays, bs=bs)
    buffers = hf_dir(tmp_path / "b", arrays, masks, bs=bs)
    GPT.from_pretrained(plain)  # warm up (imports, caches)
    peaks = []
    for d in (plain, buffers):
        tracemalloc.start()
        model = GPT.from_pretrained(d)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < peaks[0] + (256 << 10), peaks
    w = model.transformer.h[1].attn.c_attn.weight.detach().numpy()
    assert np.array_equal(w, arrays["h.1.attn.c_attn.weight"].T)


# ----------------------------------------------------------------------------- DataLoader
@pytest.mark.parametrize(
    "batch, values, dtype",
    [  # torch.utils.data.default_collate's results (torch 2.x), by the first element's type
        ([1, 2.5], [1.0, 2.5], np.float32),  # int first: torch.tensor(batch) infers float32
        ([True, 2], [1, 2], np.int64),  # bool is an int: torch.tensor infers int64
        ([2, True], [2, 1], np.int64),
        ([True, False], [True, False], np.bool_),
        ([True, 2.5], [1.0, 2.5], np.float32),
        ([1, 2], [1, 2], np.int64),
        ([2.5, 1], [2.5, 1.0], np.float64),  # float first: always float64
        ([1.5, True], [1.5, 1.0], np.float64),
        ([np.int64(1), 2.5], [1.0, 2.5], np.float32),  # NumPy scalars: as_tensor infers
        ([np.int32(1), 2**40], [1, 2**40], np.int64),
        ([np.float64(1), np.float32(2)], [1.0, 2.0], np.float64),
        ([np.int16(1), np.int16(2)], [1, 2], np.int16),
        ([np.float16(1), np.float16(2)], [1.0, 2.0], np.float16),
    ],
)
def test_collate_of_scalars_follows_pytorch(batch, values, dtype):
    out = default_collate(batch)
    assert out.numpy().tolist() == values and out.dtype == dtype


def test_collate_of_scalars_matches_torch_itself():
    torch_collate = pytest.importorskip("torch.utils.data", reason=TORCH).default_collate

    values = [0, 1, -3, 2.5, -0.5, True, False]
    for batch in itertools.product(values, repeat=2):
        want = torch_collate(list(batch))
        got = default_collate(list(batch))
        assert got.numpy().tolist() == want.tolist(), batch
        assert str(got.dtype) == str(want.dtype), batch


class Endless(IterableDataset):
    def __iter__(self):
        return itertools.count()


class Five(Dataset):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("bs", [0, -1, 1.5, 2.0, True, "2"])
@pytest.mark.parametrize("ds", [Endless(), Five()], ids=["iterable", "map"])
def test_batch_size_must_be_a_positive_int_for_every_dataset(ds, bs):
    msg = f"batch_size should be a positive integer value, but got batch_size={bs!r}"
    with no_hang(), pytest.raises(ValueError) as e:
        next(iter(DataLoader(ds, batch_size=bs)))
    assert str(e.value) == msg
    with pytest.raises(ValueError, match="drop_last"):
        DataLoader(ds, batch_size=2, drop_last=1)


def test_valid_batch_sizes_still_work_on_a_stream():
    assert next(iter(DataLoader(Endless(), batch_size=3))).tolist() == [0, 1, 2]
    assert next(iter(DataLoader(Endless(), batch_size=None))) == 0


@pytest.mark.parametrize("replacement", [False, True])
def test_random_sampler_on_an_empty_source_refuses_num_samples(replacement):
    with no_hang(), pytest.raises(ValueError, match="empty"):
        list(RandomSampler([], replacement=replacement, num_samples=5))
    with no_hang(), pytest.raises(ValueError, match="empty"):
        list(DataLoader(Five(), sampler=RandomSampler([], replacement, num_samples=5)))


def test_other_samplers_terminate_or_refuse():
    with no_hang():
        assert list(SubsetRandomSampler([])) == []
        assert list(RandomSampler([])) == []
        with pytest.raises(ValueError, match="batch_size"):
            BatchSampler(range(3), 0, False)
        with pytest.raises(ValueError, match="num_samples"):
            WeightedRandomSampler([1.0, 1.0], True)
        with pytest.raises(RuntimeError, match="multinomial"):
            list(WeightedRandomSampler([], 5))
        with pytest.raises(RuntimeError, match="multinomial"):
            list(WeightedRandomSampler([0.0, 0.0], 5))
        # with replacement the draws are made lazily, so a huge num_samples costs nothing
        it = iter(WeightedRandomSampler([0.0, 1.0, 3.0], 10**10))
        assert all(next(it) in (1, 2) for _ in range(3000))


# ----------------------------------------------------------------------------- round 4: writers
def special_nodes(tmp_path) -> dict:
    """Things that exist and are not regular files, all under tmp_path: a FIFO, a directory,
    and (as root) a character device like /dev/null."""
    nodes = {"fifo": tmp_path / "fifo", "dir": tmp_path / "dir"}
    os.mkfifo(nodes["fifo"])
    nodes["dir"].mkdir()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        nodes["chardev"] = tmp_path / "null"
        os.mknod(nodes["chardev"], stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return nodes


def test_the_atomic_writer_never_replaces_what_is_not_a_regular_file(tmp_path):
    from gpt.store.checkpoint import atomic_write_bytes

    for kind, p in special_nodes(tmp_path).items():
        before = os.lstat(p)
        with pytest.raises(OSError, match="not a regular file"):
            atomic_write_bytes(p, b"data")
        after = os.lstat(p)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), kind
    atomic_write_bytes(tmp_path / "new", b"a")  # a missing path or a regular file: written
    atomic_write_bytes(tmp_path / "new", b"b")
    assert (tmp_path / "new").read_bytes() == b"b"


def test_save_refuses_a_device_fifo_or_directory_in_one_line(tmp_path):
    for kind, p in special_nodes(tmp_path).items():
        before = os.lstat(p)
        with no_hang(), pytest.raises(OSError) as e:
            tg.save({"a": 1}, p)
        assert str(p) in str(e.value) and "\n" not in str(e.value), kind
        assert "not a regular file" in str(e.value) or kind == "dir", str(e.value)
        assert os.lstat(p).st_mode == before.st_mode, kind
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_save_through_a_symlink_writes_its_target_and_keeps_the_mode(tmp_path):
    real, link = tmp_path / "real.tg", tmp_path / "link.tg"
    real.write_text("old")
    os.chmod(real, 0o640)
    os.symlink("real.tg", link)
    tg.save({"a": tg.ones(2)}, link)
    assert link.is_symlink() and os.readlink(link) == "real.tg"
    assert tg.load(real)["a"].tolist() == [1.0, 1.0]
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o640
    tg.save({"a": 2}, real)  # a plain re-save keeps the mode too
    assert stat.S_IMODE(os.stat(real).st_mode) == 0o640


@pytest.mark.parametrize("name", ["", "a" * 300])
def test_save_to_an_impossible_name_names_the_users_path(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError) as e:
        tg.save({"a": 1}, name)
    msg = str(e.value)
    assert "\n" not in msg and ".tmp" not in msg and "save:" in msg, msg
    assert repr(name)[:40] in msg or name[:40] in msg, msg
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "obj",
    [
        np.longdouble(1.5),
        np.complex128(1 + 2j),
        np.array([1 + 2j]),
        np.array(["a"]),
        np.array([None]),
        np.zeros(2, dtype=[("a", "f4")]),
        np.datetime64("2020-01-01"),
    ],
    ids=["longdouble", "complex128", "complex128[]", "str[]", "object[]", "struct", "datetime"],
)
def test_save_refuses_a_dtype_it_cannot_store_in_one_line(tmp_path, obj):
    with pytest.raises((TypeError, ValueError), match=r"^save: cannot store dtype \S+") as e:
        tg.save({"x": obj}, tmp_path / "x.tg")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "x.tg").exists()


def test_save_stores_big_endian_arrays_by_value(tmp_path):
    tg.save({"a": np.array([1.0, 2.0], ">f4"), "b": np.array([3], ">i8")}, tmp_path / "x.tg")
    got = tg.load(tmp_path / "x.tg")
    assert got["a"].tolist() == [1.0, 2.0] and got["b"].tolist() == [3]


@pytest.mark.parametrize("shape", [[2**62, 2**62, 0], [2**64, 0], [0, 2**63 - 1, 2**63 - 1]])
def test_load_refuses_a_shape_whose_size_overflows(tmp_path, shape):
    p = tmp_path / "x.tg"
    meta = {"tensorgrad.json": json.dumps({"__array__": "a"})}
    st_file(p, {"a": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}, b"", meta)
    assert "corrupt" in refused(p)


# ----------------------------------------------------------------------------- round 4: collate
@pytest.mark.parametrize(
    "batch, dtype, values",
    [
        ([1, np.float64(2.5)], "float64", [1.0, 2.5]),
        ([1, 2 + 0j], "complex64", [1, 2]),
        ([1, np.float16(2)], "float16", [1.0, 2.0]),
        ([np.int64(1), np.float32(2)], "float32", [1.0, 2.0]),
        ([1, 2 + 0j, np.float64(1)], "complex128", [1, 2, 1]),
        ([True, np.uint8(3)], "uint8", [1, 3]),
        ([1, -(2**63)], "int64", [1, -(2**63)]),
    ],
)
def test_collate_infers_numbers_dtype_as_pytorch(batch, dtype, values):
    out = default_collate(batch).numpy()
    assert out.dtype == np.dtype(dtype) and out.tolist() == values


@pytest.mark.parametrize(
    "batch, error",
    [
        ([2**64], ValueError),
        ([1, 2**63], ValueError),
        ([1, "a"], TypeError),
        ([1, None], RuntimeError),
        ([1.5, None], TypeError),
        ([1.5, "a"], TypeError),
        ([np.datetime64("2020-01-01")] * 2, TypeError),
        ([np.array(["2020-01-01"], "datetime64[D]")] * 2, TypeError),
        ([1 + 2j], TypeError),
    ],
    ids=str,
)
def test_collate_refuses_what_pytorch_refuses_in_one_line(batch, error):
    with pytest.raises(error) as e:
        default_collate(batch)
    assert "\n" not in str(e.value)


def test_collate_keeps_transposed_strings_a_tuple_as_pytorch():
    ints, strs = default_collate([(1, "a"), (2, "b")])
    assert ints.tolist() == [1, 2] and strs == ("a", "b")


def test_weighted_sampler_replacement_must_be_a_bool():
    with pytest.raises(ValueError, match="replacement"):
        WeightedRandomSampler([1, 1], 2, replacement="no")


class _ForeignGenerator:  # a torch.Generator-like object that is not tensorgrad's
    pass


@pytest.mark.parametrize("gen", [5, "x", _ForeignGenerator()], ids=["int", "str", "foreign"])
@pytest.mark.parametrize(
    "make",
    [
        lambda g: list(RandomSampler(range(3), generator=g)),
        lambda g: list(RandomSampler(range(3), replacement=True, generator=g)),
        lambda g: list(SubsetRandomSampler([0, 1], generator=g)),
        lambda g: list(WeightedRandomSampler([1, 1], 2, generator=g)),
        lambda g: random_split(range(4), [2, 2], generator=g),
    ],
    ids=["random", "random-replacement", "subset", "weighted", "random_split"],
)
def test_a_generator_that_is_not_tensorgrads_is_one_type_error(make, gen):
    with pytest.raises(TypeError, match="tensorgrad.Generator") as e:
        make(gen)
    assert "\n" not in str(e.value)
