"""Training-run checkpoints: the latest and best state of a `gpt-train` run (safetensors + JSON).

A run directory (``--out-dir``) holds the latest checkpoint, its ``best/`` subdirectory the
one with the lowest validation loss (weights only, no optimizer state)::

    ckpt.json                  everything that is not an array: configs, iteration, RNG and
                               sampler states, optimizer step counts and hyperparameters,
                               the tokenizer, and the names of the two files below
    model-000500.safetensors   model.state_dict() (a tied lm_head.weight is not repeated)
    optim-000500.safetensors   AdamW moments, as state.{i}.exp_avg and state.{i}.exp_avg_sq

Crash safety: the array files carry the iteration in their names and are written first,
ckpt.json (which names them) last, each write atomic; files that ckpt.json no longer names
are deleted only after that. A process killed at any moment leaves a ckpt.json whose files
exist and belong together: the new checkpoint or the previous one, never a mix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tensorgrad as tg

from .checkpoint import CheckpointError, atomic_write_json, load_arrays, read_json, save_arrays
from .config import GPTConfig

FORMAT = "tensorgrad-gpt/train-checkpoint/1"
CKPT_JSON = "ckpt.json"
BEST_DIR = "best"
WHICH = ("best", "latest")


# ----------------------------------------------------------------------------- optimizer state
def optimizer_arrays(optimizer) -> tuple[dict, dict]:
    """AdamW.state_dict() split into arrays (for safetensors) and JSON (steps, groups)."""
    sd = optimizer.state_dict()
    arrays, steps = {}, {}
    for i, st in sd["state"].items():
        arrays[f"state.{i}.exp_avg"] = st["exp_avg"]
        arrays[f"state.{i}.exp_avg_sq"] = st["exp_avg_sq"]
        steps[str(i)] = int(st["step"])
    groups = [dict(g, betas=list(g["betas"])) for g in sd["param_groups"]]
    return arrays, {"param_groups": groups, "steps": steps}


def optimizer_state(arrays: dict, meta: dict) -> dict:
    """The inverse of optimizer_arrays: a dict for AdamW.load_state_dict."""
    state = {}
    for i, step in meta["steps"].items():
        try:
            m, v = arrays[f"state.{i}.exp_avg"], arrays[f"state.{i}.exp_avg_sq"]
        except KeyError as e:
            raise CheckpointError(f"optimizer state lacks {e.args[0]}") from None
        state[int(i)] = {"step": step, "exp_avg": m, "exp_avg_sq": v}
    return {"param_groups": meta["param_groups"], "state": state}


# ----------------------------------------------------------------------------- save / load
def checkpoint_dir(out_dir, which: str = "latest") -> Path:
    """Where a run keeps a checkpoint: the run directory (latest) or its best/ subdirectory."""
    if which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    return Path(out_dir) / BEST_DIR if which == "best" else Path(out_dir)


def has_checkpoint(directory) -> bool:
    return (Path(directory) / CKPT_JSON).is_file()


def model_arrays(model) -> dict:
    """model.state_dict() without the duplicate name of a tied unembedding."""
    state = {k: tg.as_array(v) for k, v in model.state_dict().items()}  # Tensors -> arrays
    if getattr(model, "lm_head", 0) is None:
        state.pop("lm_head.weight", None)
    return state


def save(directory, ckpt: dict, model, optimizer=None) -> None:
    """Write a checkpoint into ``directory`` (see the module docstring for the order).

    ckpt: JSON-able dict with at least 'iter'; 'format', 'files' and (with an optimizer)
    'optim' are filled in here.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    it = int(ckpt["iter"])
    files = {"model": f"model-{it:06d}.safetensors"}
    save_arrays(d / files["model"], model_arrays(model))
    ckpt = dict(ckpt, format=FORMAT, files=files, optim=None)
    if optimizer is not None:
        files["optim"] = f"optim-{it:06d}.safetensors"
        arrays, meta = optimizer_arrays(optimizer)
        save_arrays(d / files["optim"], arrays)
        ckpt["optim"] = meta
    atomic_write_json(d / CKPT_JSON, ckpt)  # the commit point
    keep = set(files.values())
    for pattern in ("model-*.safetensors", "optim-*.safetensors", ".model-*.tmp", ".optim-*.tmp",
                    f".{CKPT_JSON}.*.tmp"):
        for f in d.glob(pattern):
            if f.name not in keep:
                f.unlink(missing_ok=True)


def read_ckpt(directory) -> dict:
    """The ckpt.json of a checkpoint directory (checked to be ours; arrays not read)."""
    d = Path(directory)
    if not has_checkpoint(d):
        raise CheckpointError(f"no checkpoint in {d} ({CKPT_JSON} not found)")
    ckpt = read_json(d / CKPT_JSON)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        got = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise CheckpointError(
            f"{d / CKPT_JSON} is not a gpt-train checkpoint (format {got!r}, "
            f"expected {FORMAT!r})"
        )
    return ckpt


def load(directory, with_optimizer: bool = True) -> tuple[dict, dict, dict | None]:
    """(ckpt dict, model arrays, AdamW state dict or None) from a checkpoint directory."""
    d = Path(directory)
    ckpt = read_ckpt(d)
    files = ckpt.get("files") or {}
    model = load_arrays(d / files.get("model", "?"))
    optim = None
    if with_optimizer and ckpt.get("optim") is not None:
        optim = optimizer_state(load_arrays(d / files.get("optim", "?")), ckpt["optim"])
    return ckpt, model, optim


def load_model(out_dir, which: str = "best", device: str = "cpu"):
    """(GPT in eval mode, tokenizer, ckpt dict, directory used) from a gpt-train run.

    which='best' falls back to the latest checkpoint when the run has no best/ yet (it was
    stopped before its first evaluation).
    """
    from .model import GPT
    from .tokenizer import tokenizer_from_dict

    d = checkpoint_dir(out_dir, which)
    if which == "best" and not has_checkpoint(d) and has_checkpoint(out_dir):
        d = Path(out_dir)
    if not has_checkpoint(d):
        raise CheckpointError(
            f"no checkpoint in {out_dir}: train one with gpt-train --out-dir {out_dir}"
        )
    ckpt, arrays, _ = load(d, with_optimizer=False)
    try:
        config = GPTConfig.from_dict(ckpt["model_config"])
        tok = tokenizer_from_dict(ckpt["tokenizer"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{d / CKPT_JSON} is incomplete or invalid ({e})") from None
    model = GPT(config)
    try:
        model.load_state_dict({k: np.asarray(v) for k, v in arrays.items()})
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{d} weights do not fit the model config: {e}") from None
    model.to(device)
    model.eval()
    return model, tok, ckpt, d
