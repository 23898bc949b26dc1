"""From the command line to a TrainConfig: the parser (built from TrainConfig's fields) and
the layers it resolves: the defaults, then (with --resume) the checkpoint's config, then a
--config JSON file, then the flags given."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from ..config import GPTConfig
from ..hfdata import absolute as hf_absolute
from ..hfdata import is_spec as is_hf_spec
from ..hub import is_hub_name
from ..store import run_checkpoint as rc
from ..store.errors import CheckpointError
from .checks import validate
from .config import FIELDS, FIXED_ON_RESUME, TrainConfig, UsageError, check_types, kind, run_name

RESUME_KEYS = ("iter", "model_config", "train_config", "samplers", "rng", "tokenizer", "data")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """gpt-train's flags: one per TrainConfig field, then the run-control flags. Absent flags
    stay absent (argparse.SUPPRESS), so the lower layers (checkpoint, file) show through."""
    p = _Parser(
        prog="gpt-train",
        argument_default=argparse.SUPPRESS,
        description="Train a GPT with tensorgrad. With no arguments: a character-level model "
        "on the built-in Shakespeare corpus, ending with a sample. Checkpoints go to "
        "--out-dir; --resume continues a run exactly.",
    )
    groups = {}
    for f in dataclasses.fields(TrainConfig):
        m = f.metadata
        g = groups.setdefault(m["group"], p.add_argument_group(m["group"]))
        show = m["show"] and f.default is not None
        help = m["help"] + (f" (default {f.default})" if show else "")
        flag = "--" + f.name.replace("_", "-")
        if kind(f) is bool and f.default:  # on by default: --flag / --no-flag
            g.add_argument(flag, action=argparse.BooleanOptionalAction, help=m["help"])
        elif kind(f) is bool:
            g.add_argument(flag, action="store_true", help=help)
        else:
            g.add_argument(
                flag, type=kind(f), metavar=m["metavar"], choices=m["choices"], help=help
            )
    g = groups["evaluation and output"]
    g.add_argument(
        "--no-sample",
        dest="sample_tokens",
        action="store_const",
        const=0,
        help="print no sample at the end",
    )
    g = p.add_argument_group("run control")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out-dir from its latest checkpoint; its config "
        "is reused (flags may change e.g. --max-iters, not the model or data)",
    )
    g.add_argument(
        "--allow-code-change",
        action="store_true",
        help="with --resume: continue even though the model's code (gpt/model.py and the "
        "layers it uses) is not the code that trained the checkpoint, whose digest it "
        "records; without it such a resume is refused",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh even though --out-dir holds a checkpoint (deletes it)",
    )
    g.add_argument(
        "--config",
        metavar="FILE",
        help='JSON object with TrainConfig keys (e.g. {"max_iters": 500}); '
        "command-line flags override it",
    )
    return p


def read_config_file(path: str) -> dict:
    """A --config JSON file: an object whose keys are TrainConfig fields."""
    if Path(path).exists() and not Path(path).is_file():  # a FIFO would block the read
        raise UsageError(f"--config {path} is not a regular file")
    try:
        obj = json.loads(Path(path).read_text("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--config {path} does not exist") from None
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8
        raise UsageError(f"--config {path} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise UsageError(f"--config {path} must hold a JSON object")
    out = {k.replace("-", "_"): v for k, v in obj.items()}
    unknown = sorted(set(out) - set(FIELDS))
    if unknown:
        raise UsageError(f"--config {path}: unknown keys {unknown}; known: {sorted(FIELDS)}")
    return out


def resolve_config(argv: list[str] | None) -> tuple[TrainConfig, dict | None, dict]:
    """(config, checkpoint dict when resuming, run-control flags)."""
    args = vars(build_parser().parse_args(argv))
    control = {k: args.pop(k, False) for k in ("resume", "overwrite", "allow_code_change")}
    config_file = args.pop("config", None)
    layers = [read_config_file(config_file)] if config_file else []
    layers.append(args)
    for layer in layers:
        check_types(layer)
        for k in ("data", "init_from"):
            if k == "data" and is_hf_spec(layer.get(k)):
                layer[k] = hf_absolute(layer[k])
            elif layer.get(k) and not (k == "init_from" and is_hub_name(layer[k])):
                layer[k] = str(Path(layer[k]).expanduser().resolve())
    given = {k: v for layer in layers for k, v in layer.items()}
    if control["resume"] and control["overwrite"]:
        raise UsageError(
            "--resume continues the checkpoint and --overwrite deletes it: give one of them"
        )
    if given.get("data") and given.get("dataset"):
        raise UsageError("give --dataset (built-in corpus) or --data (your text), not both")
    base = dataclasses.asdict(TrainConfig())
    out_dir = given.get("out_dir") or f"out/{run_name({**base, **given})}"
    ckpt = None
    if control["resume"]:
        ckpt, saved = _resumed_config(out_dir, base, given)
        base.update(saved)
    cfg = TrainConfig(**{**base, **given, "out_dir": out_dir})
    return cfg, ckpt, control


def _resumed_config(out_dir: str, base: dict, given: dict) -> tuple[dict, dict]:
    """(the checkpoint in out_dir, its train_config), checked: resumable, and none of the
    flags given changes what a resumed run keeps (FIXED_ON_RESUME)."""
    if not rc.has_checkpoint(out_dir):
        raise UsageError(
            f"--resume: no checkpoint in {out_dir} (ckpt.json not found); "
            "check --out-dir or start without --resume"
        )
    ckpt = rc.read_ckpt(out_dir)
    missing = [k for k in RESUME_KEYS if k not in ckpt]
    if missing:
        raise CheckpointError(
            f"{out_dir}/ckpt.json lacks {', '.join(missing)}: it was not "
            "written by gpt-train and cannot be resumed"
        )
    rc.checked_tokenizer(ckpt, GPTConfig.from_dict(ckpt["model_config"]), f"{out_dir}/ckpt.json")
    saved = {k: v for k, v in (ckpt.get("train_config") or {}).items() if k in FIELDS}
    try:
        check_types(saved)
        validate(TrainConfig(**{**base, **saved}), check_paths=False)
    except UsageError as e:
        raise CheckpointError(f"{out_dir}/ckpt.json train_config: {e}") from None
    for k in FIXED_ON_RESUME:
        if k in given and given[k] != saved.get(k):
            flag = "--" + k.replace("_", "-")
            raise UsageError(
                f"--resume: {flag} {given[k]} differs from the checkpoint's "
                f"{saved.get(k)}; a resumed run keeps its model, data and seed"
            )
    return ckpt, saved
