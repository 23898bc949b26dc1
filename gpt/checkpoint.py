"""Checkpoints as safetensors + JSON only: arrays in safetensors, everything else in JSON.

Every write is atomic (temporary file in the same directory, flush + fsync, rename),
so a process killed at any moment leaves the previous file intact. Also loads
HuggingFace GPT-2 directories (config.json + model.safetensors).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from tensorgrad import to_numpy

from .config import GPTConfig


class CheckpointError(Exception):
    """A checkpoint is missing, unreadable or does not fit (message says which file)."""


def atomic_write_bytes(path, data: bytes) -> None:
    path = Path(path)
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


def read_json(path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None


def save_arrays(path, arrays: dict) -> None:
    """name -> array (any device) into one safetensors file, atomically."""
    from safetensors.numpy import save

    host = {k: np.ascontiguousarray(to_numpy(v)) for k, v in arrays.items()}
    atomic_write_bytes(path, save(host))


def load_arrays(path) -> dict:
    from safetensors.numpy import load

    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found") from None
    try:
        return load(data)
    except Exception as e:  # safetensors raises its own error types on corrupt headers
        raise CheckpointError(f"{path} is not a valid safetensors file ({e})") from None


# ----------------------------------------------------------------------------- GPT-2 (HF)

# HF activation_function -> GPTConfig.gelu (gelu_new, gelu_fast and gelu_pytorch_tanh are all
# the tanh approximation; anything else would load silently wrong)
_HF_GELU = {"gelu_new": "tanh", "gelu_fast": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none",
            "gelu_python": "none"}
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_config(d: dict) -> GPTConfig:
    """GPTConfig from a HuggingFace GPT-2 config.json dict."""
    act = d.get("activation_function", "gelu_new")
    if act not in _HF_GELU:
        raise CheckpointError(
            f"config.json: activation_function {act!r} is not supported "
            f"(one of {sorted(_HF_GELU)})"
        )
    try:
        return GPTConfig(
            block_size=d.get("n_positions", d.get("n_ctx", 1024)),
            vocab_size=d["vocab_size"], n_layer=d["n_layer"], n_head=d["n_head"],
            n_embd=d["n_embd"], dropout=0.0, bias=True,
            gelu=_HF_GELU[act],
            tie_weights=d.get("tie_word_embeddings", True),
            layer_norm_eps=d.get("layer_norm_epsilon", 1e-5),
        )
    except KeyError as e:
        raise CheckpointError(f"config.json lacks the key {e.args[0]!r}") from None
    except ValueError as e:  # GPTConfig.validate: a bad value
        raise CheckpointError(f"config.json: {e}") from None


def load_hf_gpt2(cls, path: Path):
    """Build ``cls(config)`` from a GPT-2 directory; Conv1D (in, out) weights are transposed."""
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
    config = hf_config(read_json(path / "config.json"))
    raw = load_arrays(st)
    state = {}
    for k, v in raw.items():
        if k.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers, not parameters
        name = k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k
        if name.endswith(_CONV1D):
            v = v.T
        state[name] = np.ascontiguousarray(v, dtype=np.float32)
    model = cls(config)
    try:
        model.load_state_dict(state)
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{st} does not fit a GPT-2 of {config}: {e}") from None
    return model
