"""Training-run checkpoints: the latest and best state of a `gpt-train` run (safetensors + JSON).

A run directory (``--out-dir``) holds the latest checkpoint, its ``best/`` subdirectory the
one with the lowest validation loss (weights only, no optimizer state)::

    ckpt.json                  everything that is not an array: configs, iteration, RNG and
                               sampler states, optimizer step counts and hyperparameters,
                               the tokenizer, and the names of the two files below
    model-000500.safetensors   model.state_dict() (a tied lm_head.weight is not repeated)
    optim-000500.safetensors   AdamW moments, as state.{i}.exp_avg and state.{i}.exp_avg_sq

ckpt.json also records each array file's sha256, checked on load. Loading validates before
it allocates (see gpt.store.validate): ckpt.json's fields are schema-checked, its file names must be
plain names of regular files in the directory, and the safetensors headers must hold exactly
the shapes (float32) the model config implies; weights with NaN or inf are refused.

Crash safety: the array files carry the iteration in their names and are written first,
ckpt.json (which names them) last, each write atomic; files that ckpt.json no longer names
are deleted only after that. A process killed at any moment leaves a ckpt.json whose files
exist and belong together: the new checkpoint or the previous one, never a mix. A reader
(load_model) that a save overtakes, finding the files its ckpt.json named deleted, starts
over from the new ckpt.json (read_while_rotating).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import tensorgrad as tg

from . import model_code
from . import validate as v
from .checkpoint import atomic_write_json, load_arrays, read_json, save_arrays
from .errors import CheckpointError

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
        arrays[f"state.{i}.exp_avg"] = tg.as_array(st["exp_avg"])
        arrays[f"state.{i}.exp_avg_sq"] = tg.as_array(st["exp_avg_sq"])
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
    sha = {"model": save_arrays(d / files["model"], model_arrays(model))}
    ckpt = dict(ckpt, format=FORMAT, files=files, sha256=sha, optim=None)
    if optimizer is not None:
        files["optim"] = f"optim-{it:06d}.safetensors"
        arrays, meta = optimizer_arrays(optimizer)
        sha["optim"] = save_arrays(d / files["optim"], arrays)
        ckpt["optim"] = meta
    atomic_write_json(d / CKPT_JSON, ckpt)  # the commit point
    keep = set(files.values())
    for pattern in (
        "model-*.safetensors",
        "optim-*.safetensors",
        ".model-*.tmp",
        ".optim-*.tmp",
        f".{CKPT_JSON}.*.tmp",
    ):
        for f in d.glob(pattern):
            if f.name not in keep:
                f.unlink(missing_ok=True)


def read_ckpt(directory) -> dict:
    """The ckpt.json of a checkpoint directory, schema-checked (arrays not read)."""
    d = Path(directory)
    if not has_checkpoint(d):
        raise CheckpointError(f"no checkpoint in {d} ({CKPT_JSON} not found)")
    ckpt = read_json(d / CKPT_JSON, 1 << 30)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        got = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise CheckpointError(
            f"{d / CKPT_JSON} is not a gpt-train checkpoint (format {got!r}, expected {FORMAT!r})"
        )
    check_ckpt(ckpt, str(d / CKPT_JSON))
    return ckpt


def _nonneg_int(x) -> bool:
    return v.is_int(x) and x >= 0


def _pcg64(x) -> bool:
    """A numpy PCG64 bit_generator.state dict."""
    return (
        isinstance(x, dict)
        and x.get("bit_generator") == "PCG64"
        and isinstance(x.get("state"), dict)
        and all(_nonneg_int(x["state"].get(k)) for k in ("state", "inc"))
        and _nonneg_int(x.get("has_uint32"))
        and _nonneg_int(x.get("uinteger"))
    )


def _hex64(x) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(ch in "0123456789abcdef" for ch in x)


def check_ckpt(ckpt: dict, where: str) -> None:
    """Type and range of every field a loader reads (CheckpointError names the field).

    Fields only a resumed run needs (rng, samplers, data, train_config) are checked when
    present; train.py insists on them when resuming.
    """
    need = v.need
    need(ckpt, "iter", where, _nonneg_int, "a non-negative integer")
    files = need(
        ckpt,
        "files",
        where,
        lambda x: isinstance(x, dict) and "model" in x,
        'an object naming the "model" file',
    )
    for k in files:
        if k not in ("model", "optim"):
            raise CheckpointError(f"{where}: files has the unknown entry {k!r}")
        v.plain_file(Path(where).parent, files[k], f"{where} files.{k}")
    sha = need(ckpt, "sha256", where, lambda x: isinstance(x, dict), "an object", optional=True)
    for k in sha or {}:
        need(sha, k, f"{where} sha256", _hex64, "64 lowercase hex digits")
    need(ckpt, "model_config", where, lambda x: isinstance(x, dict), "a JSON object")
    v.model_config(ckpt["model_config"], where)
    tok = need(
        ckpt,
        "tokenizer",
        where,
        lambda x: isinstance(x, dict) and "type" in x,
        'an object with a "type"',
    )
    if tok["type"] == "char":
        need(tok, "chars", f"{where} tokenizer", lambda x: isinstance(x, str), "a string")
    elif tok["type"] == "bpe":
        need(
            tok,
            "vocab",
            f"{where} tokenizer",
            lambda x: (
                isinstance(x, dict)
                and all(isinstance(a, str) and _nonneg_int(b) for a, b in x.items())
            ),
            "an object of token -> non-negative integer id",
        )
        need(
            tok,
            "merges",
            f"{where} tokenizer",
            lambda x: isinstance(x, list) and all(isinstance(m, str) for m in x),
            "a list of strings",
        )
    else:
        raise CheckpointError(
            f"{where}: tokenizer.type must be 'char' or 'bpe', got {tok['type']!r}"
        )
    for k in ("val_loss", "best_val_loss", "best_train_loss"):
        need(ckpt, k, where, v.is_number, "a finite number or null", optional=True)
    need(
        ckpt,
        "elapsed_s",
        where,
        lambda x: v.is_number(x) and x >= 0,
        "a non-negative number",
        optional=True,
    )
    need(ckpt, "tokens_seen", where, _nonneg_int, "a non-negative integer", optional=True)
    need(ckpt, "evaluated", where, lambda x: isinstance(x, bool), "true or false", optional=True)
    need(ckpt, "train_config", where, lambda x: isinstance(x, dict), "a JSON object", optional=True)
    rng = need(ckpt, "rng", where, lambda x: isinstance(x, dict), "a JSON object", optional=True)
    if rng is not None:
        need(rng, "seed", f"{where} rng", _nonneg_int, "a non-negative integer")
        need(rng, "cpu", f"{where} rng", _pcg64, "a PCG64 generator state")
    samplers = need(
        ckpt, "samplers", where, lambda x: isinstance(x, dict), "a JSON object", optional=True
    )
    for name, st in (samplers or {}).items():
        ok = isinstance(st, dict) and _pcg64(st.get("bit_generator"))
        if not ok:
            raise CheckpointError(f"{where}: samplers.{name} must hold a PCG64 generator state")
    data = need(ckpt, "data", where, lambda x: isinstance(x, dict), "a JSON object", optional=True)
    if data is not None:
        for k in ("dir", "source_hash"):
            need(data, k, f"{where} data", lambda x: isinstance(x, str), "a string")
    optim = need(
        ckpt, "optim", where, lambda x: isinstance(x, dict), "a JSON object", optional=True
    )
    if optim is not None:
        _check_optim(optim, f"{where} optim")
    need(
        ckpt,
        model_code.KEY,
        where,
        model_code.valid,
        'an object with the model\'s "class" and code "digest"',
        optional=True,
    )


def _check_optim(optim: dict, where: str) -> None:
    def group(g) -> bool:
        return (
            isinstance(g, dict)
            and all(v.is_number(g.get(k)) and g[k] >= 0 for k in ("lr", "eps", "weight_decay"))
            and isinstance(g.get("betas"), list)
            and len(g["betas"]) == 2
            and all(v.is_number(b) and 0 <= b < 1 for b in g["betas"])
            and isinstance(g.get("params"), list)
            and all(map(_nonneg_int, g["params"]))
        )

    v.need(
        optim,
        "param_groups",
        where,
        lambda x: isinstance(x, list) and all(map(group, x)),
        "a list of AdamW parameter groups (lr, betas, eps, weight_decay, params)",
    )
    v.need(
        optim,
        "steps",
        where,
        lambda x: (
            isinstance(x, dict)
            and all(k.isascii() and k.isdigit() and _nonneg_int(s) for k, s in x.items())
        ),
        "an object of parameter index -> non-negative step count",
    )


def check_model_file(directory, ckpt: dict) -> None:
    """The model file's header against ckpt's model config (reads only the header): a resumed
    run checks this before its memory estimate, which trusts the config."""
    d = Path(directory)
    path = v.plain_file(d, ckpt["files"]["model"], f"{d / CKPT_JSON} files.model")
    config = v.model_config(ckpt["model_config"], str(d / CKPT_JSON))
    v.check_tensors(path, v.read_header(path), v.expected_shapes(config))


def load(
    directory, with_optimizer: bool = True, ckpt: dict | None = None
) -> tuple[dict, dict, dict | None]:
    """(ckpt dict, model arrays, AdamW state dict or None) from a checkpoint directory (the
    files ``ckpt`` names when given, as read_ckpt returned it; else ckpt.json's).

    Everything is validated first (see the module docstring); a failure is one
    CheckpointError line naming the file and what is wrong with it.
    """
    d = Path(directory)
    ckpt = read_ckpt(d) if ckpt is None else ckpt
    where = str(d / CKPT_JSON)
    config = v.model_config(ckpt["model_config"], where)
    need = v.estimate_bytes(config, train=False)
    v.check_memory(need, f"the model in {d} ({v.gib(need // 12)} of weights)")
    files, sha = ckpt["files"], ckpt.get("sha256") or {}
    want = v.expected_shapes(config)
    model = load_arrays(d / files["model"], want, sha.get("model"))
    optim = load_optimizer(d, ckpt) if with_optimizer else None
    return ckpt, model, optim


def load_optimizer(directory, ckpt: dict) -> dict | None:
    """The AdamW state dict of the checkpoint ``ckpt`` (as read_ckpt returned it) in
    ``directory``, validated as ``load`` does; None when it holds none (best/ keeps none)."""
    d = Path(directory)
    if ckpt.get("optim") is None:
        return None
    where = str(d / CKPT_JSON)
    files, sha = ckpt["files"], ckpt.get("sha256") or {}
    if "optim" not in files:
        raise CheckpointError(f"{where}: files lacks the optim entry its optim state needs")
    path = v.plain_file(d, files["optim"], f"{where} files.optim")
    _check_moments(path, ckpt, v.expected_shapes(v.model_config(ckpt["model_config"], where)))
    return optimizer_state(load_arrays(path, None, sha.get("optim")), ckpt["optim"])


def _check_moments(path: Path, ckpt: dict, want: dict) -> None:
    """The optim file's header: state.{i}.exp_avg/exp_avg_sq (float32) for exactly the indices
    with a step count, each pair of one shape, the shapes those of distinct model parameters.
    AdamW.load_state_dict then matches each to its parameter."""
    header = v.read_header(path)
    steps = ckpt["optim"]["steps"]
    names = {f"state.{i}.{m}" for i in steps for m in ("exp_avg", "exp_avg_sq")}
    if set(header) != names:
        odd = min(set(header) ^ names)
        raise CheckpointError(
            f"{path} does not match the optimizer state in ckpt.json "
            f"({odd!r} is in one but not the other)"
        )
    pool = [tuple(s) for s in want.values()]
    for i in steps:
        m, s2 = header[f"state.{i}.exp_avg"], header[f"state.{i}.exp_avg_sq"]
        if m["dtype"] != "F32" or s2["dtype"] != "F32" or m["shape"] != s2["shape"]:
            raise CheckpointError(
                f"{path}: the moments of parameter {i} are not two float32 "
                "arrays of one shape; the file is corrupt"
            )
        try:
            pool.remove(tuple(m["shape"]))
        except ValueError:
            raise CheckpointError(
                f"{path}: the moments of parameter {i} have shape "
                f"{tuple(m['shape'])}, which no (other) parameter of the "
                "model has; the file is corrupt"
            ) from None


def load_model(out_dir, which: str = "best", device: str = "cpu"):
    """(GPT in eval mode, tokenizer, ckpt dict, directory used) from a gpt-train run.

    which='best' falls back to the latest checkpoint when the run has no best/ yet (it was
    stopped before its first evaluation). When the model's code is not the code the
    checkpoint records (gpt.store.model_code), one line on stderr says so.
    """
    return load_model_and_optimizer(out_dir, which, device, optimizer=False)[:4]


def load_model_and_optimizer(out_dir, which: str = "best", device: str = "cpu", optimizer=True):
    """load_model's (model, tokenizer, ckpt, directory) and the AdamW state dict that goes
    with those weights, or None: the checkpoint's own, or for best/ (which keeps none) the
    latest checkpoint's when that one holds the very same weights (same iteration and sha256);
    an older best/ has none to be had."""
    from ..model import GPT

    d = checkpoint_dir(out_dir, which)
    if which == "best" and not has_checkpoint(d) and has_checkpoint(out_dir):
        d = Path(out_dir)
    if not has_checkpoint(d):
        raise CheckpointError(
            f"no checkpoint in {out_dir}: train one with gpt-train --out-dir {out_dir}"
        )
    ckpt, config, tok, arrays, state = read_while_rotating(
        d, lambda d: _read_for_model(d, optimizer)
    )
    if optimizer and state is None and d != Path(out_dir):
        state = _same_weights_optimizer(Path(out_dir), ckpt)
    model = GPT(config)
    try:
        model.load_state_dict({k: np.asarray(a) for k, a in arrays.items()})
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{d} weights do not fit the model config: {e}") from None
    model_code.say_code_change(ckpt.get(model_code.KEY), model, f"the checkpoint in {d}")
    model.to(device)
    model.eval()
    return model, tok, ckpt, d, state


def _read_for_model(d: Path, optimizer: bool = False):
    """(ckpt, model config, tokenizer, weights, AdamW state or None) of one ckpt.json and
    the files it names."""
    ckpt = read_ckpt(d)
    config = v.model_config(ckpt["model_config"], str(d / CKPT_JSON))
    tok = checked_tokenizer(ckpt, config, str(d / CKPT_JSON))  # before the weights are read
    _, arrays, state = load(d, with_optimizer=optimizer, ckpt=ckpt)
    return ckpt, config, tok, arrays, state


def _same_weights_optimizer(latest: Path, ckpt: dict) -> dict | None:
    """The latest checkpoint's AdamW state when it holds the weights of ``ckpt`` (a best/
    one): the same iteration and model sha256; else None."""

    def read(d: Path):
        c = read_ckpt(d)
        sha, own = (c.get("sha256") or {}).get("model"), (ckpt.get("sha256") or {}).get("model")
        if c["iter"] != ckpt["iter"] or sha is None or sha != own:
            return None
        return load_optimizer(d, c)

    try:
        return read_while_rotating(latest, read)
    except CheckpointError:
        return None


ROTATIONS = 8  # how many times a reader starts over because a run saved under it


def _stamp(d: Path):
    try:
        st = (d / CKPT_JSON).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read_while_rotating(d: Path, read):
    """read(d), started over when it fails because a running gpt-train replaced the checkpoint
    under it (ckpt.json was rewritten and the files it named deleted): the reader gets the
    checkpoint it named or a newer one, whole. A failure with ckpt.json unchanged is raised."""
    for _ in range(ROTATIONS):
        named = _stamp(d)
        try:
            return read(d)
        except CheckpointError:
            if _stamp(d) == named:
                raise
    raise CheckpointError(
        f"the checkpoint in {d} changed {ROTATIONS} times while it was read (the run saves "
        "faster than it can be read); try again"
    )


def checked_tokenizer(ckpt: dict, config, where: str):
    """The checkpoint's tokenizer, which must have exactly the model's vocabulary size."""
    from ..tokenizer import tokenizer_from_dict

    try:
        tok = tokenizer_from_dict(ckpt["tokenizer"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: the tokenizer is invalid ({e})") from None
    if tok.vocab_size != config.vocab_size:
        raise CheckpointError(
            f"{where}: the tokenizer has {tok.vocab_size} tokens but the model "
            f"config {config.vocab_size}; they must be equal"
        )
    return tok
