"""Both safetensors readers refuse every malformed layout, each in its own words (issue 53).

gpt's loader (gpt.store.validate.read_header, under load_arrays and from_pretrained) and
tensorgrad.load read the same layout: an 8-byte header length, a JSON header of tensor entries
{dtype, shape, data_offsets}, then the data, which the entries must tile exactly. Each way a
file can break that layout is refused before any array is read, in one line that says which
way (a gap is not an overlap, a header past the end of the file is not bad JSON), and the
reasons are distinct from one another.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import tensorgrad as tg
from gpt.store import validate
from gpt.store.checkpoint import load_arrays
from gpt.store.errors import CheckpointError
from tensorgrad import serialization

F = "F32"


def entry(begin, end, shape=(2,), dtype=F):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


# name -> (tensor entries, bytes of data, what the refusal says)
LAYOUTS = {
    "a gap between two tensors": (
        {"a": entry(0, 8), "b": entry(12, 20)},  # the last ends where the file does
        20,
        'a gap of 4 bytes after the data of "a", before the data of "b"',
    ),
    "a gap before the first tensor": (
        {"a": entry(4, 12)},
        12,
        'a gap of 4 bytes at the start of the data, before the data of "a"',
    ),
    "two tensors overlapping": (
        {"a": entry(0, 8), "b": entry(4, 12)},
        12,
        'the data of "b" (bytes 4 to 12) overlaps that of "a"',
    ),
    "the same bytes twice": (
        {"a": entry(0, 8), "b": entry(0, 8)},
        8,
        'the data of "b" (bytes 0 to 8) overlaps that of "a"',
    ),
    "a tensor past the end of the file": (
        {"a": entry(0, 8)},
        4,
        'the data of "a" (bytes 0 to 8) runs past the end of the file, whose data is 4 bytes',
    ),
    "offsets backwards": (
        {"a": entry(8, 0)},
        8,
        'the data of "a" ends (at byte 0) before it begins (8)',
    ),
    "bytes left after the last tensor": (
        {"a": entry(0, 4, shape=(1,))},
        8,
        "4 bytes follow the last tensor's data (the file is padded)",
    ),
    "a size its shape does not have": (
        {"a": entry(0, 8, shape=(3,))},
        8,
        'the data of "a" is 8 bytes; its shape [3] of F32 needs 12',
    ),
    "an unknown dtype": ({"a": entry(0, 8, dtype="X9")}, 8, 'has the dtype "X9", not one of'),
    "a dtype that is not a name": (
        {"a": entry(0, 8, dtype=[4])},
        8,
        "has the dtype [4], not one of",
    ),
    "a negative dimension": ({"a": entry(0, 8, shape=(-2,))}, 8, 'the shape of "a" is not a list'),
    "a shape NumPy cannot allocate": (
        {"a": entry(0, 0, shape=(2**40, 2**40, 0))},
        0,
        'the shape of "a" is too large',
    ),
    "three offsets": (
        {"a": {"dtype": F, "shape": [2], "data_offsets": [0, 8, 9]}},
        8,
        'the data_offsets of "a" are not two non-negative integers',
    ),
    "negative offsets": (
        {"a": {"dtype": F, "shape": [2], "data_offsets": [-8, 0]}},
        8,
        'the data_offsets of "a" are not two non-negative integers',
    ),
    "an entry that is not an object": ({"a": [1, 2]}, 8, 'the entry of "a" is not a JSON object'),
}


def write(path, header: bytes, data_bytes: int, length: int | None = None) -> None:
    n = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header + bytes(data_bytes))


def gpt_refusal(path) -> str:
    with pytest.raises(CheckpointError) as e:
        load_arrays(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path} is not a valid safetensors file ("), msg
    return msg[len(f"{path} is not a valid safetensors file (") : -1]


def tg_refusal(path) -> str:
    with pytest.raises(ValueError) as e:
        tg.load(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"load: {path} "), msg
    return msg[len(f"load: {path} ") :]


def tg_header(entries: dict) -> bytes:
    tree = {k: {"__array__": k} for k in entries}
    return json.dumps({"__metadata__": {"tensorgrad.json": json.dumps(tree)}, **entries}).encode()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_malformed_layout_is_refused_in_its_own_words_by_both_loaders(tmp_path, layout):
    entries, data, says = LAYOUTS[layout]
    write(tmp_path / "gpt.safetensors", json.dumps(entries).encode(), data)
    assert says in gpt_refusal(tmp_path / "gpt.safetensors")
    write(tmp_path / "tg.pt", tg_header(entries), data)
    why = tg_refusal(tmp_path / "tg.pt")
    assert why.startswith("is corrupt: ") and says in why, why


def test_the_reasons_are_distinct(tmp_path):
    """What one layout's refusal says appears in no other's, but for layouts of one kind (two
    gaps, two overlaps, two malformed dtypes, two malformed offset pairs)."""
    said = {}
    for layout, (entries, data, _) in LAYOUTS.items():
        write(tmp_path / layout, json.dumps(entries).encode(), data)
        said[layout] = gpt_refusal(tmp_path / layout)
    same = [
        {"a gap between two tensors", "a gap before the first tensor"},
        {"two tensors overlapping", "the same bytes twice"},
        {"an unknown dtype", "a dtype that is not a name"},
        {"three offsets", "negative offsets"},
    ]
    for a, (_, _, says) in LAYOUTS.items():
        for b in LAYOUTS:
            if a != b and {a, b} not in same:
                assert says not in said[b], f"{a!r} and {b!r} are refused alike: {said[b]}"


def test_a_well_formed_layout_loads(tmp_path):
    """The control: the same writer, a tiling of the data, loads in both."""
    entries = {"a": entry(0, 8), "b": entry(8, 20, shape=(3,)), "e": entry(20, 20, shape=(0,))}
    write(tmp_path / "gpt.safetensors", json.dumps(entries).encode(), 20)
    arrays = load_arrays(tmp_path / "gpt.safetensors")
    assert {k: v.shape for k, v in arrays.items()} == {"a": (2,), "b": (3,), "e": (0,)}
    write(tmp_path / "tg.pt", tg_header(entries), 20)
    assert {k: v.shape for k, v in tg.load(tmp_path / "tg.pt").items()} == {
        "a": (2,),
        "b": (3,),
        "e": (0,),
    }


@pytest.mark.parametrize("past", [1, 1000, 2**40])
def test_a_header_length_past_the_end_of_the_file_is_refused_at_once(tmp_path, past):
    """Under the maximum header size but past the end of the file: refused before the header
    is read, saying that it does not fit in the file (not that it is not JSON)."""
    header = json.dumps({"a": entry(0, 8)}).encode()
    size = 8 + len(header) + 8
    length = size - 8 + past
    assert length <= validate.MAX_HEADER or past == 2**40
    write(tmp_path / "gpt.safetensors", header, 8, length=length)
    why = gpt_refusal(tmp_path / "gpt.safetensors")
    assert why == f"its header of {length:,} bytes does not fit in the file, {size:,} bytes"
    write(tmp_path / "tg.pt", header, 8, length=length)
    why = tg_refusal(tmp_path / "tg.pt")
    fits = f"its header of {length} bytes does not fit in the file ({size} bytes)"
    assert why == f"is not a tensorgrad file: {fits}"


def test_a_header_over_the_maximum_is_refused_though_the_file_holds_it(tmp_path, monkeypatch):
    monkeypatch.setattr(validate, "MAX_HEADER", 16)
    monkeypatch.setattr(serialization, "MAX_HEADER", 16)
    header = json.dumps({"a": entry(0, 8)}).encode()
    write(tmp_path / "gpt.safetensors", header, 8)
    assert "is over the 16 a header may have" in gpt_refusal(tmp_path / "gpt.safetensors")
    write(tmp_path / "tg.pt", tg_header({"a": entry(0, 8)}), 8)
    assert "is over the 16 bytes a header may have" in tg_refusal(tmp_path / "tg.pt")


def test_a_valid_file_that_safetensors_wrote_still_loads(tmp_path):
    from safetensors.numpy import save_file

    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
    save_file(a, tmp_path / "m.safetensors")
    got = load_arrays(tmp_path / "m.safetensors")
    assert all(np.array_equal(got[k], a[k]) for k in a)
