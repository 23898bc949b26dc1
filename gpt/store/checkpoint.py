"""Checkpoints as safetensors + JSON only: arrays in safetensors, everything else in JSON.

Every write is atomic (temporary file in the same directory, flush + fsync, rename),
so a process killed at any moment leaves the previous file intact. Also loads
HuggingFace GPT-2 directories (config.json + model.safetensors).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import math
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from tensorgrad import to_numpy

from ..config import GPTConfig
from . import model_code
from .errors import CheckpointError
from .validate import (
    check_memory,
    check_tensors,
    estimate_bytes,
    expected_shapes,
    gib,
    hf_model_config,
    read_header,
    regular_file,
)


def atomic_write_bytes(path, data) -> None:
    """Write ``data`` (bytes, str as UTF-8, or any contiguous buffer) to ``path`` so that readers
    see the old file or the new one, never half of one: the project's one atomic writer.

    A temporary file next to ``path`` is written, flushed and fsynced, renamed over ``path``,
    and the directory is fsynced so that the rename itself is durable. A path that exists and
    is not a regular file (a device, a FIFO, a directory) is refused: the rename would replace it.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if path.exists() and not path.is_file():  # (a symbolic link: what it points to)
        # the rename would put a regular file where a device, FIFO or directory was
        raise OSError(errno.EINVAL, f"{path} is not a regular file: it was left as it is")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_json(path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def read_json(path, max_bytes: int = 256 << 20) -> dict:
    """A JSON file that must be a regular file of at most max_bytes (not a FIFO or device)."""
    regular_file(Path(path), "a JSON file", max_bytes)
    try:
        return json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found") from None
    except (OSError, ValueError, RecursionError) as e:  # ValueError: JSON, UTF-8, int digits
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None


def save_arrays(path, arrays: dict) -> str:
    """name -> array (any device) into one safetensors file, atomically; returns its sha256."""
    from safetensors.numpy import save

    host = {k: np.ascontiguousarray(to_numpy(v)) for k, v in arrays.items()}
    data = save(host)
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def load_arrays(
    path,
    want: dict | None = None,
    sha256: str | None = None,
    dtypes=("F32",),
    optional=(),
    names=None,
) -> dict:
    """The arrays of a safetensors file, checked before and after reading.

    Before: a regular file whose header parses and (with ``want``, name -> shape) holds exactly
    those tensors in one of ``dtypes``. After: the bytes have the recorded ``sha256`` (when
    given), and every float array is finite. Each failure is one CheckpointError line.
    With ``names`` (and no sha256), only those tensors are read, each at its offsets: the
    others' bytes are never touched.
    """
    from safetensors import safe_open
    from safetensors.numpy import load

    path = Path(path)
    header = read_header(path)
    if want is not None:
        check_tensors(path, header, want, dtypes, optional)
    if names is not None and sha256 is None:
        try:
            with safe_open(str(path), framework="numpy") as f:
                arrays = {k: f.get_tensor(k) for k in header if k in names}
        except Exception as e:  # safetensors raises its own error types on corrupt headers
            raise CheckpointError(f"{path} is not a valid safetensors file ({e})") from None
        return _finite(path, arrays)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise CheckpointError(
            f"{path} is corrupt: its sha256 differs from the one recorded when "
            "it was saved; restore it from a backup or use another checkpoint"
        )
    try:
        arrays = load(data)
    except Exception as e:  # safetensors raises its own error types on corrupt headers
        raise CheckpointError(f"{path} is not a valid safetensors file ({e})") from None
    return _finite(path, arrays)


def _finite(path, arrays: dict) -> dict:
    """arrays, refused when a float array holds NaN or inf."""
    for k, v in arrays.items():
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            bad = int(v.size - np.isfinite(v).sum())
            raise CheckpointError(
                f"{path}: {k} holds {bad} NaN or infinite values; the weights "
                "are unusable (use an earlier checkpoint)"
            )
    return arrays


# ----------------------------------------------------------------------------- GPT-2 (HF)

# HF activation_function -> GPTConfig.gelu (gelu_new, gelu_fast and gelu_pytorch_tanh are all
# the tanh approximation; anything else would load silently wrong)
_HF_GELU = {
    "gelu_new": "tanh",
    "gelu_fast": "tanh",
    "gelu_pytorch_tanh": "tanh",
    "gelu": "none",
    "gelu_python": "none",
}
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# GPT2Config fields that change the forward pass away from GPT-2's, as transformers reads them
# (truthiness), with the one value gpt computes; any other is refused by name. The others:
# n_inner (checked below), activation_function, layer_norm_epsilon, tie_word_embeddings and the
# sizes are honoured; reorder_and_upcast_attn is the same math in float32; the *_pdrop dropouts
# act only in training (gpt-train --dropout); initializer_range, summary_* (heads gpt has not),
# use_cache, the token ids and dtype leave the logits as they are.
_HF_FIXED = {
    "scale_attn_weights": (True, "scores divided by sqrt(head size)"),
    "scale_attn_by_inverse_layer_idx": (False, "no scaling by 1 / (layer index + 1)"),
    "add_cross_attention": (False, "no cross-attention blocks"),
}
# fields transformers reads by truthiness: "false" or 0 would be read unlike what it says, so
# each must be a JSON boolean; null is the default where transformers reads it as that default
# (it reads a null tie_word_embeddings as false, gpt as true: refused)
_HF_BOOLS = (
    "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx",
    "add_cross_attention",
    "reorder_and_upcast_attn",
    "tie_word_embeddings",
)
_HF_NULL_OK = ("scale_attn_by_inverse_layer_idx", "add_cross_attention", "reorder_and_upcast_attn")
# GPT2Config.attribute_map: the other names transformers accepts for four fields
_HF_ALIASES = {
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "num_attention_heads": "n_head",
    "num_hidden_layers": "n_layer",
}


def hf_config(d, where: str = "config.json") -> GPTConfig:
    """GPTConfig from a HuggingFace GPT-2 config.json dict (each field type- and range-checked;
    every field that would change the math is honoured or refused by name)."""
    if isinstance(d, dict):
        d = dict(d)
        for alias, name in _HF_ALIASES.items():
            if alias in d and name in d and d[alias] != d[name]:
                raise CheckpointError(
                    f"{where}: {alias} ({_value(d[alias])}) and {name} ({_value(d[name])}) "
                    "name one field with two values"
                )
            if alias in d:
                d[name] = d.pop(alias)
    fields = hf_model_config(d, where)
    for key in _HF_BOOLS:
        v = d.get(key)
        if key in d and not isinstance(v, bool) and not (v is None and key in _HF_NULL_OK):
            raise CheckpointError(f"{where}: {key} must be true or false, got {_value(v)}")
    if d.get("model_type", "gpt2") != "gpt2":
        raise CheckpointError(
            f"{where}: model_type {_value(d['model_type'])} is not supported (gpt loads 'gpt2')"
        )
    act = d.get("activation_function", "gelu_new")
    if act not in _HF_GELU:
        raise CheckpointError(
            f"{where}: activation_function {act!r} is not supported (one of {sorted(_HF_GELU)})"
        )
    for key, (value, means) in _HF_FIXED.items():
        if key in d and bool(d[key]) != value:
            raise CheckpointError(
                f"{where}: {key} {_value(d[key])} is not supported (gpt computes only "
                f"{json.dumps(value)}: {means})"
            )
    inner = d.get("n_inner")
    if inner is not None and inner != 4 * fields["n_embd"]:
        raise CheckpointError(
            f"{where}: n_inner {_value(inner)} is not supported (gpt's MLP is 4 * n_embd = "
            f"{4 * fields['n_embd']} wide; null means the same)"
        )
    return GPTConfig(**fields, dropout=0.0, bias=True, gelu=_HF_GELU[act])


def _value(v) -> str:
    """A config value for an error line: a scalar as JSON writes it, else its type."""
    if v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) < 40):
        return json.dumps(v)
    return f"(a JSON {type(v).__name__})"


_MASK_BUFFER = re.compile(r"transformer\.h\.(0|[1-9][0-9]{0,5})\.attn\.(bias|masked_bias)")


def _hf_names(path: Path, header: dict, config: GPTConfig) -> dict:
    """HF GPT-2 tensor name -> our parameter name, or None for a causal-mask buffer of one of
    the config's blocks (skipped, never read). Two file names for one parameter (with and
    without the ``transformer.`` prefix) are refused, naming both."""
    names, seen = {}, {}
    for k in header:
        name = k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k
        if name in seen:
            raise CheckpointError(
                f"{path} names one tensor twice: {seen[name]!r} and {k!r} are both {name!r}"
            )
        seen[name] = k
        m = _MASK_BUFFER.fullmatch(name)
        names[k] = None if m and int(m.group(1)) < config.n_layer else name
    return names


def _hf_header(path: Path, config: GPTConfig) -> dict:
    """model.safetensors' header, refused with more entries than a GPT-2 of config can hold
    (16 a block and a few more) before any entry is checked."""
    return read_header(path, max_entries=16 * config.n_layer + 32)


def check_hf_dir(path) -> GPTConfig:
    """The GPTConfig of a GPT-2 directory, validated without loading a weight: config.json's
    fields, the memory the model needs, and model.safetensors' header (every tensor's shape
    and a float dtype) against the config."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory (expected a GPT-2 checkpoint directory)")
    st = path / "model.safetensors"
    if not st.exists():
        if (path / "pytorch_model.bin").exists():
            raise CheckpointError(
                f"{path} holds only pytorch_model.bin; tensorgrad loads only safetensors (a .bin "
                "file can run code when loaded). Convert it to model.safetensors (safetensors is "
                "required)"
            )
        raise CheckpointError(f"{path} has no model.safetensors")
    config = hf_config(read_json(path / "config.json", 1 << 20), str(path / "config.json"))
    need = estimate_bytes(config, train=False)
    check_memory(need, f"the GPT-2 in {path} ({gib(need // 12)} of weights)")
    want = expected_shapes(config)
    optional = ()
    if config.tie_weights:  # some exports repeat the tied matrix as lm_head.weight
        want["lm_head.weight"] = want["transformer.wte.weight"]
        optional = ("lm_head.weight",)
    header = {}
    raw = _hf_header(st, config)
    names = _hf_names(st, raw, config)
    extra = [k for k, name in names.items() if name is not None and name not in want]
    if extra:  # named as the file names it
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise CheckpointError(
            f"{st} does not fit the model config: it has the unexpected tensor {extra[0]!r}{more}"
        )
    for k, name in names.items():
        t = raw[k]
        if name is None:
            _check_mask_buffer(st, k, t, config)
            continue
        shape = t["shape"][::-1] if name.endswith(_CONV1D) else t["shape"]
        header[name] = dict(t, shape=shape)
    check_tensors(st, header, want, dtypes=("F32", "F16", "F64"), optional=optional)
    return config


def _check_mask_buffer(path: Path, k: str, t: dict, config: GPTConfig) -> None:
    """GPT-2's causal-mask buffers are skipped, never read, yet bounded like the weights:
    attn.bias holds at most block_size ** 2 elements (its shape is (1, 1, T, T)), masked_bias
    one. A file's size then follows from the config, however large its holes."""
    top = 1 if k.endswith(".masked_bias") else config.block_size**2
    if math.prod(t["shape"]) > top:
        raise CheckpointError(
            f"{path}: the mask buffer {k} has shape {tuple(t['shape'])}, more than the "
            f"{top:,} elements it has in a GPT-2 of block size {config.block_size}"
        )


def load_hf_gpt2(cls, path: Path):
    """Build ``cls(config)`` from a GPT-2 directory (checked first by check_hf_dir); Conv1D
    (in, out) weights are transposed."""
    config = check_hf_dir(path)
    st = Path(path) / "model.safetensors"
    names = _hf_names(st, _hf_header(st, config), config)
    raw = load_arrays(st, names={k for k, name in names.items() if name is not None})
    state = {}
    for k, v in raw.items():
        name = names[k]
        if name.endswith(_CONV1D):
            v = v.T
        state[name] = np.ascontiguousarray(v, dtype=np.float32)
    del raw
    head, wte = state.get("lm_head.weight"), state.get("transformer.wte.weight")
    if config.tie_weights and head is not None and not np.array_equal(head, wte):
        # a tied config, but the file's lm_head differs from wte: transformers then leaves the
        # two untied (it ties only equal copies), and so does gpt
        config = dataclasses.replace(config, tie_weights=False)
    model = cls(config)
    try:
        model.load_state_dict(state)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{st} does not fit a GPT-2 of {config}: {e}") from None
    # an export of a gpt-train run records the code that trained it: other code says so
    recorded = read_json(Path(path) / "config.json", 1 << 20).get(model_code.HF_KEY)
    model_code.say_code_change(recorded, model, f"the model in {path}")
    return model
