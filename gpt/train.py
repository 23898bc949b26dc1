"""gpt-train: train a GPT on Shakespeare or on your own text, with checkpoints you can resume.

    gpt-train                                   # character-level Shakespeare, 10-22 min on 2 cores
    gpt-train --data notes/ --tokenizer bpe --vocab-size 2048 --max-iters 500
    gpt-train --resume --out-dir out/shakespeare-char       # continue exactly where it stopped
    gpt-train --init-from gpt2 --data my.txt --lr 3e-5 --max-iters 200    # fine-tune GPT-2
    OPENBLAS_NUM_THREADS=1 mpiexec -n 2 gpt-train   # data parallel, same losses (gpt/dist_train.py)

Configuration: TrainConfig's defaults, then (with --resume) the checkpoint's config, then a
--config JSON file, then the command-line flags; the resolved config goes into every
checkpoint. The script runs top to bottom: resolve and validate the config, prepare the
data, build the model and optimizer (or restore them), then loop: every eval_interval
iterations evaluate and checkpoint, and each iteration take one optimizer step.

Resuming is exact: the checkpoint holds the weights, the AdamW moments and step counts, the
tensorgrad RNG (dropout) and the batch samplers' generators, so N iterations in one run and
N/2 plus --resume give bitwise the same losses on CPU (with --lr-decay-iters fixed: the cosine
schedule otherwise follows --max-iters). An evaluation interrupted by a signal, or one off the
--eval-interval grid (at --max-iters), rewinds its samplers, so the resumed run repeats it or
draws what an uninterrupted run would; a checkpoint saved before its due evaluation says
"evaluated": false and the resumed run evaluates first.

Reliability: the run directory is locked (gpt.lock) for the life of the process; every input
is checked before work starts, including a memory estimate (gpt.validate); a non-finite loss,
or one far above the run's best (--divergence-factor), stops the run before it saves.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
import signal
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import tensorgrad as tg
from tensorgrad import get_array_module, to_device
from tensorgrad.cuda import set_matmul_precision

from . import diagnostics as diag
from . import dist_train
from . import run_checkpoint as rc
from .checkpoint import CheckpointError, atomic_write_bytes, check_hf_dir
from .config import PRESETS, GPTConfig
from .data import (
    BatchSampler,
    DataError,
    default_cache_dir,
    load_tokenizer_from_dir,
    prepare,
    read_shakespeare,
    read_text_path,
)
from .hub import is_hub_name, resolve, source_problem
from .lock import LockError, RunLock
from .model import GPT
from .optim import clip_grad_norm_, cosine_lr
from .validate import LIMITS, check_memory, estimate_bytes, n_params


@dataclass
class TrainConfig:
    # data
    dataset: str = "shakespeare"  # the built-in corpus, used when data is None
    data: str | None = None  # a text file or a folder of .txt files
    tokenizer: str = "char"  # 'char' or 'bpe' (ignored with init_from: GPT-2's own)
    vocab_size: int | None = None  # bpe only (default 4096)
    # model: a preset, individual overrides (None = the preset's), or a GPT-2 to fine-tune
    preset: str = "char-small"
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int | None = None
    dropout: float | None = None
    init_from: str | None = None  # Hugging Face GPT-2 directory or hub name (gpt.hub)
    # optimisation
    batch_size: int = 32
    grad_accum: int = 1  # micro-batches per optimizer step
    max_iters: int = 3500  # THE run-length knob: 10-22 min of char-small on 2 CPU cores
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # None = max_iters
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 = off
    # stop when a loss exceeds max(factor x the run's best, ln vocab_size); 0 = off
    divergence_factor: float = 4.0
    # evaluation, output
    eval_interval: int = 250
    eval_iters: int = 20
    out_dir: str | None = None  # None = out/<dataset>-<tokenizer>
    seed: int = 1337
    device: str = "cpu"
    dtype: str = "float32"  # matmul precision on the GPU: float32 | tf32 | bf16
    diagnose: bool = False
    sample_tokens: int = 500  # sample printed at the end; 0 = none


INT_FIELDS = {
    "vocab_size",
    "n_layer",
    "n_head",
    "n_embd",
    "block_size",
    "batch_size",
    "grad_accum",
    "max_iters",
    "warmup_iters",
    "lr_decay_iters",
    "eval_interval",
    "eval_iters",
    "seed",
    "sample_tokens",
}
FLOAT_FIELDS = {
    "dropout",
    "lr",
    "min_lr",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "divergence_factor",
}
STR_FIELDS = {"dataset", "data", "tokenizer", "preset", "init_from", "out_dir", "device", "dtype"}
DTYPES = {"float32": "highest", "tf32": "tf32", "bf16": "bf16"}  # -> set_matmul_precision
MODEL_FIELDS = ("preset", "n_layer", "n_head", "n_embd", "block_size", "dropout")
# what a resumed run keeps from its checkpoint, whatever the flags say
FIXED_ON_RESUME = ("dataset", "data", "tokenizer", "vocab_size", "init_from", "seed", *MODEL_FIELDS)
EXIT_USAGE, EXIT_ERROR, EXIT_SIGINT, EXIT_SIGTERM = 2, 1, 130, 143


class UsageError(Exception):
    """A bad flag or value; main prints the message as one line and exits 2."""


class Interrupted(Exception):
    """SIGINT/SIGTERM outside the training loop (reading data, loading, the final sample):
    main exits at once with 130/143 (a hung read of a FIFO would swallow a mere flag)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    S = argparse.SUPPRESS  # absent flags stay absent, so lower layers (checkpoint, file) show
    d = TrainConfig()
    p = _Parser(
        prog="gpt-train",
        argument_default=S,
        description="Train a GPT with tensorgrad. With no arguments: a character-level model "
        "on the built-in Shakespeare corpus, 10 to 22 minutes on 2 CPU cores, ending with a "
        "sample. Checkpoints go to --out-dir; --resume continues a run exactly.",
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--dataset",
        choices=("shakespeare",),
        help="built-in corpus, downloaded once into the cache ($GPT_CACHE_DIR or "
        "~/.cache/tensorgrad-gpt) (default shakespeare)",
    )
    g.add_argument(
        "--data",
        metavar="PATH",
        help="train on your own UTF-8 text: a file, or a folder of .txt files",
    )
    g.add_argument(
        "--tokenizer",
        choices=("char", "bpe"),
        help="char: one token per character; bpe: byte-level BPE trained on the "
        f"data (default {d.tokenizer})",
    )
    g.add_argument("--vocab-size", type=int, metavar="N", help="BPE vocabulary size (default 4096)")
    g = p.add_argument_group("model")
    g.add_argument(
        "--preset",
        metavar="NAME",
        help=f"model size: one of {', '.join(PRESETS)} (default "
        f"{d.preset}); the vocabulary size always comes from the tokenizer",
    )
    g.add_argument(
        "--n-layer", type=int, metavar="N", help="transformer blocks (default: the preset's)"
    )
    g.add_argument("--n-head", type=int, metavar="N", help="attention heads; must divide --n-embd")
    g.add_argument("--n-embd", type=int, metavar="N", help="embedding width")
    g.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help="context length in tokens (with --init-from: crop GPT-2's 1024)",
    )
    g.add_argument("--dropout", type=float, metavar="X", help="dropout probability in [0, 1)")
    g.add_argument(
        "--init-from",
        metavar="DIR|NAME",
        help="fine-tune a Hugging Face GPT-2 directory (config.json, "
        "model.safetensors, vocab.json, merges.txt) or hub name (gpt2, gpt2-xl, "
        "owner/repo[@revision]: fetched into the hub cache, needs the hf extra); its tokenizer "
        "is used",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--batch-size", type=int, metavar="N", help=f"sequences per micro-batch ({d.batch_size})"
    )
    g.add_argument(
        "--grad-accum",
        type=int,
        metavar="N",
        help=f"micro-batches per optimizer step ({d.grad_accum})",
    )
    g.add_argument(
        "--max-iters", type=int, metavar="N", help=f"optimizer steps in all ({d.max_iters})"
    )
    g.add_argument("--lr", type=float, metavar="X", help=f"peak learning rate ({d.lr})")
    g.add_argument(
        "--min-lr", type=float, metavar="X", help=f"learning rate after decay ({d.min_lr})"
    )
    g.add_argument(
        "--warmup-iters", type=int, metavar="N", help=f"linear warmup steps ({d.warmup_iters})"
    )
    g.add_argument(
        "--lr-decay-iters",
        type=int,
        metavar="N",
        help="cosine decay from --lr to --min-lr ends here (default --max-iters)",
    )
    g.add_argument(
        "--weight-decay",
        type=float,
        metavar="X",
        help=f"AdamW decoupled weight decay on matrices ({d.weight_decay})",
    )
    g.add_argument("--beta1", type=float, metavar="X", help=f"AdamW beta1 ({d.beta1})")
    g.add_argument("--beta2", type=float, metavar="X", help=f"AdamW beta2 ({d.beta2})")
    g.add_argument(
        "--grad-clip",
        type=float,
        metavar="X",
        help=f"clip the global gradient norm to this; 0 = off ({d.grad_clip})",
    )
    g.add_argument(
        "--divergence-factor",
        type=float,
        metavar="X",
        help="stop (keeping the last sane checkpoint) when a training or validation "
        "loss exceeds X times the run's best and ln(vocab size), i.e. worse than "
        f"uniform guessing; 0 = only NaN/inf stop the run ({d.divergence_factor})",
    )
    g = p.add_argument_group("evaluation and output")
    g.add_argument(
        "--eval-interval",
        type=int,
        metavar="N",
        help=f"evaluate and checkpoint every N steps ({d.eval_interval})",
    )
    g.add_argument(
        "--eval-iters",
        type=int,
        metavar="N",
        help=f"batches per split for each evaluation ({d.eval_iters})",
    )
    g.add_argument(
        "--out-dir",
        metavar="DIR",
        help="checkpoints, metrics.jsonl and loss.png go here "
        "(default out/<dataset>-<tokenizer>, e.g. out/shakespeare-char)",
    )
    g.add_argument(
        "--seed", type=int, metavar="N", help=f"seeds init, dropout and batches ({d.seed})"
    )
    g.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="cpu, or cuda (needs CuPy: pip install -e '.[cuda]') (default cpu)",
    )
    g.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        help="matmul precision on the GPU: float32 (default), or tf32 / bf16 tensor "
        "cores; weights and AdamW state stay float32 (the CPU always uses float32)",
    )
    g.add_argument(
        "--diagnose",
        action="store_true",
        help="check at the first step that every parameter gets a finite nonzero "
        "gradient, and log per-layer gradient norms and update/weight ratios "
        "every evaluation",
    )
    g.add_argument(
        "--sample-tokens",
        type=int,
        metavar="N",
        help=f"tokens of the sample printed at the end ({d.sample_tokens})",
    )
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


# ----------------------------------------------------------------------------- configuration
def _read_config_file(path: str) -> dict:
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
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    out = {k.replace("-", "_"): v for k, v in obj.items()}
    unknown = sorted(set(out) - fields)
    if unknown:
        raise UsageError(f"--config {path}: unknown keys {unknown}; known: {sorted(fields)}")
    return out


def _check_types(c: dict) -> None:
    for k, v in c.items():
        if v is None and k in INT_FIELDS | FLOAT_FIELDS | STR_FIELDS:
            continue
        if k in INT_FIELDS and (not isinstance(v, int) or isinstance(v, bool)):
            raise UsageError(f"{k} must be an integer, got {v!r}")
        if k in FLOAT_FIELDS:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise UsageError(f"{k} must be a number, got {v!r}")
            c[k] = float(v)
        if k in STR_FIELDS and not isinstance(v, str):
            raise UsageError(f"{k} must be a string, got {v!r}")
        if k == "diagnose" and not isinstance(v, bool):
            raise UsageError(f"diagnose must be true or false, got {v!r}")


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-") or "data"


def _run_name(c: dict) -> str:
    """'shakespeare-char', 'notes-bpe', 'notes-gpt2': names the out and data directories."""
    name = _slug(Path(c["data"]).stem) if c.get("data") else c.get("dataset") or "shakespeare"
    tok = _slug(Path(c["init_from"]).name) if c.get("init_from") else c.get("tokenizer", "char")
    return f"{name}-{tok}"


def resolve_config(argv: list[str] | None) -> tuple[TrainConfig, dict | None, dict]:
    """(config, checkpoint dict when resuming, run-control flags)."""
    args = vars(build_parser().parse_args(argv))
    control = {k: args.pop(k, False) for k in ("resume", "overwrite")}
    config_file = args.pop("config", None)
    layers = [_read_config_file(config_file)] if config_file else []
    layers.append(args)
    for layer in layers:
        _check_types(layer)
        for k in ("data", "init_from"):
            if layer.get(k) and not (k == "init_from" and is_hub_name(layer[k])):
                layer[k] = str(Path(layer[k]).expanduser().resolve())
    given = {k: v for layer in layers for k, v in layer.items()}
    if control["resume"] and control["overwrite"]:
        raise UsageError(
            "--resume continues the checkpoint and --overwrite deletes it: give one of them"
        )
    if given.get("data") and given.get("dataset"):
        raise UsageError("give --dataset (built-in corpus) or --data (your text), not both")
    base = dataclasses.asdict(TrainConfig())
    out_dir = given.get("out_dir") or f"out/{_run_name({**base, **given})}"
    ckpt = None
    if control["resume"]:
        if not rc.has_checkpoint(out_dir):
            raise UsageError(
                f"--resume: no checkpoint in {out_dir} (ckpt.json not found); "
                "check --out-dir or start without --resume"
            )
        ckpt = rc.read_ckpt(out_dir)
        missing = [
            k
            for k in (
                "iter",
                "model_config",
                "train_config",
                "samplers",
                "rng",
                "tokenizer",
                "data",
            )
            if k not in ckpt
        ]
        if missing:
            raise CheckpointError(
                f"{out_dir}/ckpt.json lacks {', '.join(missing)}: it was not "
                "written by gpt-train and cannot be resumed"
            )
        rc.checked_tokenizer(
            ckpt, GPTConfig.from_dict(ckpt["model_config"]), f"{out_dir}/ckpt.json"
        )
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        saved = {k: v for k, v in (ckpt.get("train_config") or {}).items() if k in fields}
        try:
            _check_types(saved)
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
        base.update(saved)
    cfg = TrainConfig(**{**base, **given, "out_dir": out_dir})
    return cfg, ckpt, control


def validate(c: TrainConfig, check_paths: bool = True) -> None:
    """Refuse nonsense before any work is done (UsageError names the flag). check_paths=False
    skips what looks at files and devices (a saved config's values only)."""

    def positive(name, v):
        if v is not None and v <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {v}")

    for name in sorted(FLOAT_FIELDS):
        v = getattr(c, name)
        if v is not None and not math.isfinite(v):
            raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got {v}")
    if not 0 <= c.seed < 2**63:
        raise UsageError(f"--seed must be in 0..2**63-1, got {c.seed}")

    for name in (
        "batch_size",
        "grad_accum",
        "max_iters",
        "eval_interval",
        "eval_iters",
        "n_layer",
        "n_head",
        "n_embd",
        "block_size",
        "lr_decay_iters",
    ):
        positive(name, getattr(c, name))
    for name, top in LIMITS.items():
        if (getattr(c, name) or 0) > top:
            raise UsageError(
                f"--{name.replace('_', '-')} must be at most {top:,}, got {getattr(c, name):,}"
            )
    for name in (
        "warmup_iters",
        "sample_tokens",
        "weight_decay",
        "grad_clip",
        "min_lr",
        "divergence_factor",
    ):
        if getattr(c, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(c, name)}")
    if not c.lr > 0:
        raise UsageError(f"--lr must be positive, got {c.lr}")
    if c.min_lr > c.lr:
        raise UsageError(f"--min-lr ({c.min_lr}) must not exceed --lr ({c.lr})")
    for name in ("beta1", "beta2"):
        if not 0.0 <= getattr(c, name) < 1.0:
            raise UsageError(f"--{name} must be in [0, 1), got {getattr(c, name)}")
    if c.dropout is not None and not 0.0 <= c.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {c.dropout}")
    if c.dataset != "shakespeare":
        raise UsageError(f"unknown --dataset {c.dataset!r}; the built-in one is 'shakespeare'")
    if c.tokenizer not in ("char", "bpe"):
        raise UsageError(f"--tokenizer must be 'char' or 'bpe', got {c.tokenizer!r}")
    if c.vocab_size is not None:
        if c.tokenizer != "bpe" or c.init_from:
            raise UsageError(
                "--vocab-size applies to --tokenizer bpe only (a char vocabulary "
                "is the corpus's characters; --init-from brings GPT-2's)"
            )
        if c.vocab_size < 257:
            raise UsageError(
                f"--vocab-size must be at least 257 (256 bytes + <|endoftext|>), got {c.vocab_size}"
            )
    if check_paths:
        _check_data_path(c.data)
        if c.out_dir and Path(c.out_dir).exists() and not Path(c.out_dir).is_dir():
            raise UsageError(f"--out-dir {c.out_dir} exists and is not a directory")
    if c.init_from is not None:
        if check_paths and source_problem(c.init_from) is not None:
            raise UsageError(f"--init-from {source_problem(c.init_from)}")
        for name in ("n_layer", "n_head", "n_embd"):
            if getattr(c, name) is not None:
                raise UsageError(
                    f"--{name.replace('_', '-')} cannot change a pretrained "
                    "GPT-2 (--init-from); only --block-size and --dropout can"
                )
    else:
        if c.preset not in PRESETS:
            raise UsageError(f"unknown --preset {c.preset!r}; choose one of {', '.join(PRESETS)}")
        m = {**PRESETS[c.preset], **_model_overrides(c)}
        if m["n_embd"] % m["n_head"]:
            raise UsageError(
                f"n_embd ({m['n_embd']}) must be divisible by n_head "
                f"({m['n_head']}); set --n-embd / --n-head accordingly"
            )
    if c.device == "cuda" and check_paths and tg.cuda.unavailable_reason() is not None:
        raise UsageError(tg.cuda.unavailable_reason())
    if c.device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, got {c.device!r}")
    if c.dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {c.dtype!r}")


def _check_data_path(path: str | None) -> None:
    """--data must be a text file or a folder: not a FIFO (reading one blocks), a device
    (/dev/zero never ends) or an empty file (which would surface as a block-size problem)."""
    if path is None:
        return
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"--data {path} does not exist") from None
    except OSError as e:
        raise UsageError(f"--data {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        return
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(
            f"--data {path} is not a regular file or a folder (a FIFO, device or "
            "socket); pass a text file or a folder of .txt files"
        )
    if st.st_size == 0:
        raise UsageError(f"--data {path} is an empty file (0 bytes); pass a file with text in it")


def check_fits(c: TrainConfig, config: GPTConfig) -> None:
    """Refuse a configuration whose training step cannot fit in the available memory."""
    need = estimate_bytes(config, c.batch_size)
    check_memory(
        need,
        f"this configuration ({num_params_text(n_params(config))} parameters, "
        f"batch {c.batch_size} x {config.block_size} tokens)",
        UsageError,
    )


def _planned_config(c: TrainConfig) -> GPTConfig:
    """The model a fresh run will build, before its data is prepared (vocabulary guessed:
    --vocab-size or 4096 for BPE, 256 for characters; --init-from's, checked with its header)."""
    if c.init_from:
        mc = check_hf_dir(resolve(c.init_from))  # a hub name: fetched into the hub cache
        return dataclasses.replace(mc, block_size=c.block_size or mc.block_size)
    vocab = (c.vocab_size or 4096) if c.tokenizer == "bpe" else 256
    return GPTConfig.from_preset(c.preset, vocab_size=vocab, **_model_overrides(c))


def num_params_text(n: int) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 1e5 else f"{n:,}"


def _model_overrides(c: TrainConfig) -> dict:
    return {k: getattr(c, k) for k in MODEL_FIELDS[1:] if getattr(c, k) is not None}


# ----------------------------------------------------------------------------- data
def _pretrained(c: TrainConfig) -> GPT:
    """GPT-2 from --init-from, with --dropout and a cropped --block-size applied."""
    model = GPT.from_pretrained(c.init_from)
    mc = model.config
    if c.block_size is not None and c.block_size > mc.block_size:
        raise UsageError(
            f"--block-size {c.block_size} exceeds the pretrained model's {mc.block_size}"
        )
    new = dataclasses.replace(
        mc,
        dropout=mc.dropout if c.dropout is None else c.dropout,
        block_size=c.block_size or mc.block_size,
    )
    if new == mc:
        return model
    state = dict(model.state_dict())
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"][: new.block_size]
    model = GPT(new)
    model.load_state_dict(state)
    return model


def load_data(c: TrainConfig, fixed_tok=None) -> tuple[Path, dict, object]:
    """(prepared data directory, its meta, tokenizer). fixed_tok: tokenize with this one."""
    docs = read_text_path(c.data) if c.data else read_shakespeare()
    name = _run_name(dataclasses.asdict(c))
    if c.tokenizer == "bpe" and not c.init_from:
        name += f"{c.vocab_size or 4096}"
    if c.data or c.init_from:  # different files of the same name get different folders
        key = f"{c.data}|{c.init_from}".encode()
        name += "-" + hashlib.sha1(key).hexdigest()[:8]
    data_dir = default_cache_dir() / "data" / name
    if not (data_dir / "meta.json").exists():  # the first time can take a while
        print(f"preparing {c.data or c.dataset} into {data_dir} ...", file=sys.stderr)
    if fixed_tok is not None:
        return data_dir, prepare(docs, data_dir, tokenizer=fixed_tok), fixed_tok
    meta = prepare(docs, data_dir, c.tokenizer, c.vocab_size)
    return data_dir, meta, load_tokenizer_from_dir(data_dir)


# ----------------------------------------------------------------------------- logging
def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None  # JSON has no nan/inf
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    return x


class Metrics:
    """metrics.jsonl, one JSON object a line, plus the in-memory history for loss.png."""

    def __init__(self, path: Path, keep_until: int | None):
        """keep_until: on resume, drop records newer than the checkpoint's iteration (a run
        killed between checkpoints logged steps that the resumed run will redo)."""
        self.path = path
        self.records: list[dict] = []
        if keep_until is not None and path.exists():
            for line in path.read_text("utf-8").splitlines():
                try:
                    r = json.loads(line)
                except (ValueError, RecursionError):
                    continue  # a line cut short by a kill
                if not isinstance(r, dict) or not isinstance(r.get("iter", 0), int):
                    continue  # not ours (edited by hand)
                if r.get("iter", 0) < keep_until or ("val_loss" in r and r["iter"] == keep_until):
                    self.records.append(r)
        text = "".join(json.dumps(r) + "\n" for r in self.records)
        atomic_write_bytes(path, text.encode())
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the whole run)

    def log(self, **record) -> None:
        record = _jsonable(record)
        self.records.append(record)
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


# ----------------------------------------------------------------------------- helpers
@tg.no_grad()
def estimate_loss(
    model,
    samplers: dict,
    eval_iters: int,
    device: str,
    stop: dict | None = None,
    ddp: dist_train.Run | None = None,
) -> dict | None:
    """Mean loss over eval_iters batches of each sampler, with dropout off; None when
    stop['signal'] gets set meanwhile (the run is being interrupted). Under mpiexec rank r
    evaluates batches r, r + N, ... (every rank draws them all, so the samplers stay alike)."""
    from tqdm import tqdm

    ddp = ddp or dist_train.SINGLE
    model.eval()
    out = {}
    # a progress bar of its own (it disappears when done): large models evaluate for minutes
    bar = tqdm(
        total=eval_iters * len(samplers),
        desc="eval",
        unit="batch",
        leave=False,
        file=sys.stderr,
        dynamic_ncols=True,
        mininterval=1.0,
        disable=not ddp.is_main,
    )
    try:
        for split, sampler in samplers.items():
            total = 0.0
            for i in range(eval_iters):
                if ddp.agree_stop(stop):
                    return None
                x, y = sampler.next_batch()
                if i % ddp.world_size == ddp.rank:
                    _, loss = model(to_device(x, device), to_device(y, device))
                    total += loss.item()
                bar.update(1)
            out[split] = ddp.mean(total) * ddp.world_size / eval_iters
    finally:
        bar.close()
        model.train()
    return out


def _bad_evaluation(losses: dict, best_val: float, params, diverged, factor: float) -> str | None:
    """Why this evaluation's state must not become a checkpoint, or None when it is sane."""
    for split, v in losses.items():
        if not math.isfinite(v):
            return f"non-finite {split} loss ({v}) in the evaluation"
    if diverged(losses["val"], best_val):
        return (
            f"the validation loss diverged: {losses['val']:.4g} is more than {factor:g}x "
            f"the run's best {best_val:.4g} and worse than guessing"
        )
    for p in params:
        xp = get_array_module(p.data)
        if not bool(xp.isfinite(p.data).all()):
            return "non-finite weights in the evaluation"
    return None


def _divergence_advice(c: TrainConfig, out: Path, saved_at: int | None) -> str:
    """What to run next: the last sane checkpoint with half the learning rate (and a --min-lr
    that stays below it, which validate() insists on)."""
    lr = c.lr / 2
    flags = f"--lr {lr:g}" + (f" --min-lr {lr / 10:g}" if c.min_lr > lr else "")
    if saved_at is None:
        return f"no checkpoint was written yet; start again with a lower learning rate ({flags})"
    return (
        f"the last good checkpoint (iter {saved_at}) in {out} is intact; continue it with a "
        f"lower learning rate: {_resume_command(c)} {flags}"
    )


def _command(*args: str) -> str:
    """How the user invoked us (gpt-train or python -m gpt.train), with args."""
    prog = "gpt-train" if Path(sys.argv[0]).name == "gpt-train" else "python -m gpt.train"
    return " ".join([prog, *map(shlex.quote, args)])


def _resume_command(c: TrainConfig) -> str:
    extra = ["--device", c.device] if c.device != "cpu" else []
    return _command("--resume", "--out-dir", c.out_dir, *extra)


# ----------------------------------------------------------------------------- the run
def train(argv: list[str] | None, stop: dict) -> int:
    """The training script; ``stop['signal']`` is set by the SIGINT/SIGTERM handler."""
    c, ckpt, control = resolve_config(argv)
    validate(c)
    ddp = dist_train.setup(c, UsageError)  # this process's rank (one, without mpiexec)
    if ckpt is not None:
        rc.check_model_file(c.out_dir, ckpt)
    check_fits(c, GPTConfig.from_dict(ckpt["model_config"]) if ckpt else _planned_config(c))
    if not ddp.is_main:  # under mpiexec rank 0 holds the lock for the run's ranks
        return _train(c, ckpt, control, stop, ddp)
    with RunLock(c.out_dir) as lock:  # one writer per run directory, for the whole run
        if lock.note:
            print(f"gpt-train: {lock.note}", file=sys.stderr)
        return _train(c, ckpt, control, stop, ddp)


def _train(
    c: TrainConfig, ckpt: dict | None, control: dict, stop: dict, ddp: dist_train.Run
) -> int:
    err = sys.stderr
    out = Path(c.out_dir)
    if ckpt is None and rc.has_checkpoint(out):
        if not control["overwrite"]:
            raise UsageError(
                f"{out} already holds a checkpoint: add --resume to continue it, "
                "--overwrite to start afresh, or choose another --out-dir"
            )
        for d in (out / rc.BEST_DIR, out):
            (d / rc.CKPT_JSON).unlink(missing_ok=True)  # ckpt.json first: no half checkpoint
            for f in [*d.glob("model-*.safetensors"), *d.glob("optim-*.safetensors")]:
                f.unlink(missing_ok=True)  # (another rank may delete it first)
    lr_decay_iters = c.lr_decay_iters or c.max_iters
    tg.manual_seed(c.seed)

    # -- data -----------------------------------------------------------------------------
    fixed_tok = None
    if ckpt is not None and c.init_from:
        from .tokenizer import tokenizer_from_dict

        fixed_tok = tokenizer_from_dict(ckpt["tokenizer"])
    elif c.init_from:
        from .tokenizer import load_tokenizer_dir

        try:
            fixed_tok = load_tokenizer_dir(resolve(c.init_from))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot load the tokenizer of {c.init_from}: {e}") from None
    with ddp.one_at_a_time():  # under mpiexec the first rank prepares, the others reuse
        data_dir, meta, tok = load_data(c, fixed_tok)
    if ckpt is not None and (
        ckpt.get("data", {}).get("source_hash") != meta["source_hash"]
        or ckpt.get("tokenizer") != tok.to_dict()
    ):
        raise UsageError(
            f"--resume: the training text or its tokenizer changed since the "
            f"checkpoint was written ({c.data or c.dataset}); resume needs the same"
        )

    # -- model and optimizer ----------------------------------------------------------------
    model = None
    if ckpt is not None:
        model_config = GPTConfig.from_dict(ckpt["model_config"])
    elif c.init_from:
        model = _pretrained(c)
        model_config = model.config
    else:
        model_config = GPTConfig.from_preset(
            c.preset, vocab_size=tok.vocab_size, **_model_overrides(c)
        )
    if model_config.vocab_size < tok.vocab_size:
        raise UsageError(
            f"the tokenizer has {tok.vocab_size} tokens but the model only "
            f"{model_config.vocab_size}"
        )
    check_fits(c, model_config)  # now with the real vocabulary
    T = model_config.block_size
    for split in ("train", "val"):
        if meta[f"{split}_tokens"] < T + 1:
            raise UsageError(
                f"block size {T} is larger than the data can fill: the {split} split has "
                f"{meta[f'{split}_tokens']} tokens and one example needs {T + 1}; use a "
                "smaller --block-size or more text"
            )
    model = model or GPT(model_config)
    model.to(c.device)
    set_matmul_precision(DTYPES[c.dtype])
    optimizer = model.configure_optimizers(c.weight_decay, c.lr, (c.beta1, c.beta2))
    samplers = {
        "train": BatchSampler(data_dir, "train", T, c.batch_size, seed=c.seed),
        "val": BatchSampler(data_dir, "val", T, c.batch_size, seed=c.seed + 1),
        # its own generator, so evaluating never changes the training batches
        "train_eval": BatchSampler(data_dir, "train", T, c.batch_size, seed=c.seed + 2),
    }
    start, best_val, val_loss, elapsed0, tokens_seen = 0, math.inf, None, 0.0, 0
    best_loss, evaluated = math.inf, True  # the run's best step loss; eval done at `start`
    if ckpt is not None:
        ckpt, arrays, optim_state = rc.load(out)
        if optim_state is None:
            raise CheckpointError(f"the checkpoint in {out} has no optimizer state to resume")
        try:
            model.load_state_dict(arrays)
            optimizer.load_state_dict(optim_state)
            for name, s in samplers.items():
                s.load_state_dict(ckpt["samplers"][name])
            tg.set_rng_state(ckpt["rng"])
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(f"the checkpoint in {out} does not fit this run ({e})") from None
        for g, wd in zip(optimizer.param_groups, (c.weight_decay, 0.0)):  # flags may change
            g["betas"], g["weight_decay"] = (c.beta1, c.beta2), wd  # these on resume
        start, val_loss = ckpt["iter"], ckpt.get("val_loss")
        best_val = ckpt.get("best_val_loss") or math.inf
        best_loss = ckpt.get("best_train_loss") or math.inf
        evaluated = ckpt.get("evaluated", True)
        elapsed0, tokens_seen = ckpt.get("elapsed_s", 0.0), ckpt.get("tokens_seen", 0)
    if ckpt is not None and start >= c.max_iters and evaluated:
        if ddp.is_main:
            print(
                f"the run in {out} is finished (iter {start} of --max-iters {c.max_iters}); "
                "raise --max-iters (and set --lr-decay-iters) to train it further, or "
                f"sample it: {_sample_command()} --out-dir {shlex.quote(str(out))}",
                file=err,
            )
        return 0
    ddp.start(model, optimizer, ckpt, start)  # mpiexec: rank 0's weights, each rank's RNG
    out.mkdir(parents=True, exist_ok=True)
    metrics = (
        Metrics(out / "metrics.jsonl", keep_until=start if ckpt is not None else None)
        if ddp.is_main
        else dist_train.NoMetrics()
    )

    tokens_per_iter = c.batch_size * T * c.grad_accum
    what = f"GPT-2 from {c.init_from}" if c.init_from else f"preset {c.preset}"
    print(
        f"data: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens, "
        f"{tok.kind} vocabulary of {tok.vocab_size} ({data_dir})",
        file=err,
    )
    n = model.num_params()
    print(
        f"model: {f'{n / 1e6:.2f}M' if n >= 1e5 else f'{n:,}'} parameters ({what}: n_layer "
        f"{model_config.n_layer}, n_head {model_config.n_head}, n_embd {model_config.n_embd}, "
        f"block_size {T}, dropout {model_config.dropout})",
        file=err,
    )
    print(
        f"training: {c.max_iters} iterations of {c.batch_size} x {T} tokens x "
        f"{c.grad_accum} accum = {tokens_per_iter:,} tokens, lr {c.lr} -> {c.min_lr}, "
        f"on {c.device}; out: {out}" + (f"; resuming at iter {start}" if ckpt else ""),
        file=err,
    )

    def checkpoint(it: int, best: bool = False) -> None:
        state = {
            "iter": it,
            "val_loss": val_loss,
            "best_val_loss": _jsonable(best_val),
            "best_train_loss": _jsonable(best_loss),
            "evaluated": evaluated_at == it,
            "elapsed_s": elapsed0 + (time.time() - t0),
            "tokens_seen": tokens_seen,
            "model_config": model_config.to_dict(),
            "train_config": dataclasses.asdict(c),
            "rng": tg.get_rng_state(),
            "samplers": {name: s.state_dict() for name, s in samplers.items()},
            "data": {"dir": str(data_dir), "source_hash": meta["source_hash"]},
            "tokenizer": tok.to_dict(),
        }
        state = ddp.checkpoint_state(state, model)  # every rank's RNG (all ranks call this)
        if not ddp.is_main:
            return
        rc.save(out, state, model, optimizer)
        if best:
            rc.save(out / rc.BEST_DIR, state, model)

    # -- the loop -----------------------------------------------------------------------------
    from tqdm import tqdm

    t0 = time.time()
    saved_at = start if ckpt is not None else None  # the newest checkpoint on disk
    evaluated_at = start if ckpt is not None and evaluated else None  # the newest evaluation
    eval_samplers = {"train": samplers["train_eval"], "val": samplers["val"]}
    params = list(model.parameters())
    floor = math.log(model_config.vocab_size)  # the loss of uniform guessing

    def diverged(loss: float, best: float) -> bool:
        """Far above the run's best and worse than guessing (see --divergence-factor)."""
        return c.divergence_factor > 0 and loss > max(c.divergence_factor * best, floor)

    def stop_diverged(what: str, it: int) -> int:
        bar.close()
        print(
            f"gpt-train: error: {what} at iter {it}; stopped without saving: "
            f"{_divergence_advice(c, out, saved_at)}",
            file=err,
        )
        return EXIT_ERROR

    warned_plot = False
    bar = tqdm(
        total=c.max_iters,
        initial=start,
        desc="train",
        unit="it",
        file=err,
        dynamic_ncols=True,
        mininterval=0.5,
    )
    it = start
    stop["armed"] = True  # from here on a signal finishes the step and saves
    try:
        while True:
            if ddp.agree_stop(stop):
                break
            # evaluate and checkpoint (unless this checkpoint's evaluation was done already)
            if (it % c.eval_interval == 0 or it == c.max_iters) and it != evaluated_at:
                before = {k: s_.state_dict() for k, s_ in eval_samplers.items()}
                losses = estimate_loss(model, eval_samplers, c.eval_iters, c.device, stop, ddp)
                off_grid = it % c.eval_interval != 0
                if losses is None or off_grid:
                    # interrupted: rewind, so the resumed run repeats this evaluation exactly;
                    # off the grid (the last iteration): rewind, so a run continued from here
                    # draws the evaluation batches an uninterrupted run would
                    for k, s_ in eval_samplers.items():
                        s_.load_state_dict(before[k])
                if losses is None:
                    break
                val_loss = losses["val"]
                metrics.log(iter=it, train_loss=losses["train"], val_loss=val_loss)
                bad = _bad_evaluation(losses, best_val, params, diverged, c.divergence_factor)
                if bad:
                    return stop_diverged(bad, it)
                evaluated_at = it
                note = ""
                if it > 0:
                    is_best = val_loss < best_val
                    best_val = min(best_val, val_loss)
                    checkpoint(it, best=is_best)
                    saved_at = it
                    note = " (best, saved)" if is_best else " (saved)"
                bar.write(
                    f"iter {it}: train loss {losses['train']:.4f}, val loss {val_loss:.4f}{note}",
                    file=err,
                )
                if (
                    ddp.is_main
                    and not diag.plot_metrics(metrics.records, out / "loss.png")
                    and not warned_plot
                ):
                    warned_plot = True
                    bar.write(
                        "loss.png skipped: matplotlib is not installed (pip install -e "
                        "'.[plot]'); `gpt-plot OUT_DIR` draws it from metrics.jsonl",
                        file=err,
                    )
            if it >= c.max_iters:
                break

            # one optimizer step
            t_step = time.time()
            lr = cosine_lr(it, c.warmup_iters, lr_decay_iters, c.lr, c.min_lr)
            for g in optimizer.param_groups:
                g["lr"] = lr
            loss_sum = 0.0
            for x, y, weight, last in ddp.micro_batches(samplers["train"]):  # this rank's share
                _, loss = model(to_device(x, c.device), to_device(y, c.device))
                loss_sum += loss.item() * weight
                if not math.isfinite(loss_sum) and not ddp.active:  # (ranks finish the step)
                    break
                if weight != 1.0:
                    loss = loss * weight  # the step follows the mean gradient
                ddp.backward(loss, sync=last)  # mpiexec: then the gradients are averaged
            loss_val = ddp.mean(loss_sum)
            if c.diagnose and it == start:
                report = diag.grad_report(model)
                bad = [r for r in report if r["status"] != diag.OK]
                if bad:
                    bar.write(
                        f"DIAGNOSE: {len(bad)} of {len(report)} parameters get no usable "
                        f"gradient at iter {it}:\n{diag.format_report(bad)}",
                        file=err,
                    )
                else:
                    bar.write(
                        f"DIAGNOSE: all {len(report)} parameters get a finite, nonzero "
                        f"gradient at iter {it}",
                        file=err,
                    )
            want_diag = c.diagnose and it % c.eval_interval == 0
            gnorms = diag.grad_norms(model) if want_diag else None
            grad_norm = (
                float(clip_grad_norm_(params, c.grad_clip)) if math.isfinite(loss_val) else None
            )
            if not math.isfinite(loss_val) or not math.isfinite(grad_norm):
                what = "loss" if not math.isfinite(loss_val) else "gradient norm"
                value = loss_val if not math.isfinite(loss_val) else grad_norm
                metrics.log(
                    iter=it, loss=loss_val, lr=lr, grad_norm=grad_norm, error=f"non-finite {what}"
                )
                return stop_diverged(f"non-finite {what} ({value})", it)
            if diverged(loss_val, best_loss):
                metrics.log(iter=it, loss=loss_val, lr=lr, grad_norm=grad_norm, error="diverged")
                return stop_diverged(
                    f"the loss diverged: {loss_val:.4g} is more than "
                    f"{c.divergence_factor:g}x the run's best step loss "
                    f"{best_loss:.4g} and worse than guessing",
                    it,
                )
            best_loss = min(best_loss, loss_val)
            before = diag.snapshot(model) if want_diag else None
            optimizer.step()
            optimizer.zero_grad()
            if want_diag:
                ratios = diag.update_ratios(before, diag.snapshot(model))
                metrics.log(iter=it, diag={"grad_norm": gnorms, "update_ratio": ratios})
            dt = time.time() - t_step
            tokens_seen += tokens_per_iter
            metrics.log(
                iter=it,
                loss=loss_val,
                lr=lr,
                grad_norm=grad_norm,
                tokens_per_s=tokens_per_iter / dt,
                elapsed_s=elapsed0 + time.time() - t0,
            )
            it += 1
            bar.update(1)
            bar.set_postfix(
                loss=f"{loss_val:.4f}",
                lr=f"{lr:.2e}",
                tok_s=f"{tokens_per_iter / dt:,.0f}",
                refresh=False,
            )
    finally:
        bar.close()
        metrics.close()

    if ddp.agree_stop(stop):
        name = signal.Signals(stop["signal"]).name
        if saved_at != it or evaluated_at != it:
            checkpoint(it)
        print(
            f"{name}: stopped at iter {it}; checkpoint saved in {out}. Resume with:\n"
            f"  {_resume_command(c)}",
            file=err,
        )
        return EXIT_SIGINT if stop["signal"] == signal.SIGINT else EXIT_SIGTERM
    stop["armed"] = False

    # -- the end: final loss and a sample ------------------------------------------------------
    if val_loss is None:
        val_loss = estimate_loss(model, {"val": samplers["val"]}, c.eval_iters, c.device, ddp=ddp)[
            "val"
        ]
    print(
        f"final val loss {val_loss:.4f} (best {best_val:.4f}) after {it} iterations; "
        f"checkpoints in {out}"
    )
    if c.sample_tokens and ddp.is_main:
        from .sample import start_ids, stream_sample

        print("---------------- sample (temperature 0.8, top_k 200) ----------------")
        stream_sample(
            model,
            tok,
            start_ids(tok, None),
            c.sample_tokens,
            temperature=0.8,
            top_k=200,
            seed=c.seed,
        )
        print("\n---------------------------------------------------------------------")
    if ddp.is_main:
        again = "sample again" if c.sample_tokens else "sample it"
        print(f"{again}: {_sample_command()} --out-dir {shlex.quote(str(out))}")
    return 0


def _sample_command() -> str:
    return "gpt-sample" if Path(sys.argv[0]).name == "gpt-train" else "python -m gpt.sample"


def main(argv: list[str] | None = None) -> int:
    """Run training; returns the exit status (0, 1 error, 2 usage, 130 SIGINT, 143 SIGTERM)."""
    tg.tune_cpu_malloc()  # keep freed activations in the heap: steps stop page-faulting them
    stop: dict = {}

    def on_signal(signum, frame):
        if not stop.get("armed"):  # before the loop (reading data, loading): stop right away
            raise Interrupted(signum)
        if stop.get("signal"):  # a second one: give up at once (the last checkpoint stands)
            raise KeyboardInterrupt
        stop["signal"] = signum
        if dist_train.launch_rank() == 0:  # (under mpiexec every rank gets it)
            os.write(
                2,
                f"\n{signal.Signals(signum).name} received: finishing this step, then "
                "saving a checkpoint (Ctrl-C again to quit without saving)\n".encode(),
            )

    previous = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            previous[s] = signal.signal(s, on_signal)
    except ValueError:  # not the main thread: no handlers, Ctrl-C raises as usual
        pass
    try:
        with dist_train.launch(
            {UsageError: EXIT_USAGE, KeyboardInterrupt: EXIT_SIGINT}, UsageError
        ):  # mpiexec: only rank 0 prints; a failure stops all
            return train(argv, stop)
    except UsageError as e:
        print(f"gpt-train: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (DataError, CheckpointError, LockError) as e:
        print(f"gpt-train: error: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_ERROR
    except Interrupted as e:
        name = signal.Signals(e.signum).name
        print(
            f"gpt-train: {name} received outside the training loop; stopped (the checkpoints "
            "already saved stand)",
            file=sys.stderr,
        )
        return EXIT_SIGINT if e.signum == signal.SIGINT else EXIT_SIGTERM
    except MemoryError:
        print(
            "gpt-train: error: out of memory (the estimate before the run was too low); "
            "use a smaller model, --batch-size or --block-size",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except OSError as e:
        print(f"gpt-train: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\ngpt-train: interrupted; the last checkpoint (if any) stands", file=sys.stderr)
        return EXIT_SIGINT
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
