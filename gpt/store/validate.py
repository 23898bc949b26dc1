"""Checks that run before anything is allocated: JSON schemas, safetensors headers, memory.

A checkpoint or GPT-2 directory is untrusted input. Everything here reads at most a file's
header and answers with one `CheckpointError` line naming the file and the field:

- `plain_file`: a file name from ckpt.json is a plain name inside its directory and a
  regular file of plausible size (not a symlink, FIFO, device or a path that climbs out);
- `model_config` / `hf_model_config`: every field's type and range;
- `read_header` + `check_tensors`: the safetensors header (8-byte length + JSON) against the
  shapes and dtypes the config implies, before a single array is created;
- `estimate_bytes` / `check_memory`: what a configuration needs against /proc/meminfo's
  MemAvailable, so an absurd size is refused with the estimate instead of swapping the machine.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

from tensorgrad.serialization import layout_problem

from ..config import GPTConfig
from .errors import CheckpointError

# Upper bounds far above any model this project can train; they only stop absurd numbers
# (the memory estimate is the real limit; n_layer's also bounds the Python objects, which
# the estimate does not count: 100,000 tiny layers fit in memory but take minutes to build).
LIMITS = {
    "block_size": 1 << 20,
    "vocab_size": 1 << 24,
    "n_layer": 1 << 10,
    "n_head": 1 << 12,
    "n_embd": 1 << 16,
}
MAX_HEADER = 100 << 20  # a safetensors header of GPT-2 XL is ~60 KB
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# ----------------------------------------------------------------------------- JSON fields
def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def need(d: dict, key: str, where: str, check, what: str, optional: bool = False):
    """d[key] if check(value) holds, else CheckpointError '<where>: <key> must be <what>'."""
    if key not in d:
        if optional:
            return None
        raise CheckpointError(f"{where}: the field {key!r} is missing")
    v = d[key]
    if optional and v is None:
        return None
    if not check(v):
        raise CheckpointError(f"{where}: {key} must be {what}, got {_short(v)}")
    return v


def _short(v) -> str:
    s = json.dumps(v) if not isinstance(v, float) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def model_config(d, where: str) -> GPTConfig:
    """GPTConfig from a ckpt.json model_config, every field checked (all of them required)."""
    if not isinstance(d, dict):
        raise CheckpointError(f"{where}: model_config must be a JSON object, got {_short(d)}")
    known = set(GPTConfig.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise CheckpointError(f"{where}: model_config has unknown fields {unknown}")
    w = f"{where}: model_config"
    for k, top in LIMITS.items():
        need(d, k, w, lambda v, top=top: is_int(v) and 0 < v <= top, f"an integer in 1..{top}")
    need(d, "dropout", w, lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)")
    need(d, "bias", w, lambda v: isinstance(v, bool), "true or false")
    need(d, "tie_weights", w, lambda v: isinstance(v, bool), "true or false")
    need(d, "gelu", w, lambda v: v in ("tanh", "none"), "'tanh' or 'none'")
    need(d, "layer_norm_eps", w, lambda v: is_number(v) and 0 < v < 1, "a number in (0, 1)")
    if d["n_embd"] % d["n_head"]:
        raise CheckpointError(
            f"{w}: n_embd ({d['n_embd']}) must be divisible by n_head ({d['n_head']})"
        )
    return GPTConfig(**d)


def hf_model_config(d, where: str) -> dict:
    """The GPTConfig fields of a HuggingFace GPT-2 config.json, each checked; GPT-2's defaults
    fill n_positions, layer_norm_epsilon and tie_word_embeddings."""
    if not isinstance(d, dict):
        raise CheckpointError(f"{where} must hold a JSON object, got {type(d).__name__}")
    out = {}
    for hf, ours in (
        ("vocab_size", "vocab_size"),
        ("n_layer", "n_layer"),
        ("n_head", "n_head"),
        ("n_embd", "n_embd"),
    ):
        top = LIMITS[ours]
        out[ours] = need(
            d, hf, where, lambda v, top=top: is_int(v) and 0 < v <= top, f"an integer in 1..{top}"
        )
    pos = "n_positions" if "n_positions" in d else "n_ctx"
    top = LIMITS["block_size"]
    out["block_size"] = (
        need(
            d,
            pos,
            where,
            lambda v: is_int(v) and 0 < v <= top,
            f"an integer in 1..{top}",
            optional=True,
        )
        or 1024
    )
    eps = need(
        d,
        "layer_norm_epsilon",
        where,
        lambda v: is_number(v) and 0 < v < 1,
        "a number in (0, 1)",
        optional=True,
    )
    out["layer_norm_eps"] = 1e-5 if eps is None else eps
    tie = need(
        d,
        "tie_word_embeddings",
        where,
        lambda v: isinstance(v, bool),
        "true or false",
        optional=True,
    )
    out["tie_weights"] = True if tie is None else tie
    need(d, "activation_function", where, lambda v: isinstance(v, str), "a string", optional=True)
    if out["n_embd"] % out["n_head"]:
        raise CheckpointError(
            f"{where}: n_embd ({out['n_embd']}) must be divisible by n_head ({out['n_head']})"
        )
    return out


# ----------------------------------------------------------------------------- files
def plain_file(directory: Path, name, where: str, max_bytes: int | None = None) -> Path:
    """directory/name, refused unless name is a plain file name and the file is regular."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise CheckpointError(
            f"{where}: file name {_short(name)} is not a plain file name "
            "inside the checkpoint directory"
        )
    path = Path(directory) / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found (named in {where})") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(
            f"{path} is not a regular file (named in {where}); a checkpoint "
            "holds only regular files"
        )
    if max_bytes is not None and st.st_size > max_bytes:
        raise CheckpointError(
            f"{path} is {st.st_size:,} bytes, more than the {max_bytes:,} "
            "a checkpoint file of this model can need"
        )
    return path


def regular_file(path: Path, what: str, max_bytes: int) -> int:
    """Size of path, refused unless it is a regular file (symlinks followed) under max_bytes."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path} is not a regular file ({what} must be one)")
    if st.st_size > max_bytes:
        raise CheckpointError(
            f"{path} is {st.st_size:,} bytes, more than {max_bytes:,}: not a plausible {what}"
        )
    return st.st_size


# ----------------------------------------------------------------------------- safetensors
def read_header(path: Path, max_entries: int | None = None) -> dict:
    """name -> {'dtype', 'shape', 'data_offsets'} from a safetensors file, reading only its
    header; checks that the offsets tile the data exactly and the file has that size
    (tensorgrad.serialization.layout_problem: each malformed layout in its own words). With
    ``max_entries``, a header naming more tensors is refused before any entry is checked."""
    size = regular_file(path, "a safetensors file", 1 << 44)
    bad = f"{path} is not a valid safetensors file"
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{bad} ({size} bytes, shorter than its 8-byte header)")
            n = int.from_bytes(head, "little")
            if n > size - 8:
                raise CheckpointError(
                    f"{bad} (its header of {n:,} bytes does not fit in the file, {size:,} bytes)"
                )
            if n > MAX_HEADER:
                raise CheckpointError(
                    f"{bad} (its header of {n:,} bytes is over the {MAX_HEADER:,} a header "
                    "may have)"
                )
            header = json.loads(f.read(n))
    except (ValueError, RecursionError):  # bad JSON or UTF-8, or an int of 5000 digits
        raise CheckpointError(f"{bad} (its header is not JSON)") from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{bad} (its header is not a JSON object)")
    header.pop("__metadata__", None)
    if max_entries is not None and len(header) > max_entries:
        raise CheckpointError(
            f"{path} does not fit the model config: its header has {len(header):,} entries, "
            f"more than the {max_entries:,} this model can hold"
        )
    why = layout_problem(header, size - 8 - n, DTYPE_BYTES)
    if why is not None:
        raise CheckpointError(f"{bad} ({why})")
    return header


def expected_shapes(c: GPTConfig) -> dict[str, tuple]:
    """GPT.state_dict()'s names and shapes for config c, computed without building it."""
    C, V, T = c.n_embd, c.vocab_size, c.block_size
    s = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (T, C)}
    ln = [".weight", ".bias"] if c.bias else [".weight"]
    lin = {
        "attn.c_attn": (3 * C, C),
        "attn.c_proj": (C, C),
        "mlp.c_fc": (4 * C, C),
        "mlp.c_proj": (C, 4 * C),
    }
    for i in range(c.n_layer):
        h = f"transformer.h.{i}."
        for name in ("ln_1", "ln_2"):
            s.update({h + name + e: (C,) for e in ln})
        for name, (o, n) in lin.items():
            s[h + name + ".weight"] = (o, n)
            if c.bias:
                s[h + name + ".bias"] = (o,)
    s.update({"transformer.ln_f" + e: (C,) for e in ln})
    if not c.tie_weights:
        s["lm_head.weight"] = (V, C)
    return s


def check_tensors(
    path: Path, header: dict, want: dict[str, tuple], dtypes=("F32",), optional=()
) -> None:
    """The header holds exactly the tensors of `want` (name -> shape), in one of `dtypes`;
    names in `optional` may be absent."""
    missing = [k for k in want if k not in header and k not in optional]
    extra = [k for k in header if k not in want]
    if missing or extra:
        what = f"lacks {missing[0]!r}" if missing else f"has the unexpected tensor {extra[0]!r}"
        n = len(missing) + len(extra)
        raise CheckpointError(
            f"{path} does not fit the model config: it {what}"
            + (f" (and {n - 1} more differences)" if n > 1 else "")
        )
    for k, t in header.items():
        if tuple(t["shape"]) != tuple(want[k]):
            raise CheckpointError(
                f"{path} does not fit the model config: {k} has shape "
                f"{tuple(t['shape'])}, the config needs {tuple(want[k])}"
            )
        if t["dtype"] not in dtypes:
            raise CheckpointError(
                f"{path}: {k} is {t['dtype']}, expected "
                f"{' or '.join(dtypes)}; the file is corrupt or not a model"
            )


# ----------------------------------------------------------------------------- memory
def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes; None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def n_params(c: GPTConfig) -> int:
    return sum(math.prod(s) for s in _compact_shapes(c))


def _compact_shapes(c: GPTConfig):
    """expected_shapes(c) with the layers folded into one entry (cheap for a huge n_layer)."""
    C, V = c.n_embd, c.vocab_size
    per_layer = (2 if c.bias else 1) * 2 * C + 12 * C * C + (9 * C if c.bias else 0)
    yield (V, C)
    yield (c.block_size, C)
    yield (c.n_layer, per_layer)
    yield ((2 if c.bias else 1) * C,)
    if not c.tie_weights:
        yield (V, C)


def estimate_bytes(c: GPTConfig, batch_size: int = 0, train: bool = True) -> int:
    """Bytes that one training step (train=True: weights, gradients, AdamW moments, the
    checkpoint's serialised copy, activations for batch_size x block_size tokens) or loading
    for inference (weights, the file's bytes, one copy) needs. An estimate, on the high side."""
    P = n_params(c)
    if not train:
        return 3 * 4 * P
    B, T, C = batch_size, c.block_size, c.n_embd
    # per layer and token: ~16·C saved floats (ln, qkv, attention out, MLP 4C twice, ...) and
    # 2·n_head·T for the attention probabilities (and their dropout mask)
    acts = c.n_layer * B * T * (16 * C + 2 * c.n_head * T) + 3 * B * T * c.vocab_size
    return 4 * (4 * P + 2 * P + acts)  # weights, grads, 2 moments; the save buffer; activations


def gib(n: int) -> str:
    """Bytes for a message: MiB, GiB or PiB."""
    if n < 2**30:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**30:,.1f} GiB" if n < 2**50 else f"{n / 2**50:,.1f} PiB"


def check_memory(need_bytes: int, what: str, error=CheckpointError) -> None:
    """Refuse when need_bytes exceeds MemAvailable (skipped where that is unknown)."""
    have = available_memory()
    if have is not None and need_bytes > have:
        raise error(
            f"{what} needs about {gib(need_bytes)} of memory but {gib(have)} is "
            "available; choose a smaller model, batch or block size"
        )
