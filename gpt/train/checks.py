"""Checks before any work is done: every flag's range, the data path, the memory a run needs.
Each failure is a UsageError naming the flag."""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from pathlib import Path

import tensorgrad as tg

from ..config import PRESETS, GPTConfig
from ..hfdata import is_spec as is_hf_spec
from ..hfdata import parse as parse_hf_spec
from ..hub import resolve, source_problem
from ..store.checkpoint import check_hf_dir
from ..store.validate import LIMITS, check_memory, estimate_bytes, n_params
from .config import DTYPES, FIELDS, TrainConfig, UsageError, kind, model_overrides

POSITIVE = ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "n_layer",
            "n_head", "n_embd", "block_size", "lr_decay_iters")  # fmt: skip
NON_NEGATIVE = ("warmup_iters", "sample_tokens", "weight_decay", "grad_clip", "min_lr",
                "divergence_factor")  # fmt: skip


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def validate(c: TrainConfig, check_paths: bool = True) -> None:
    """Refuse nonsense before any work is done (UsageError names the flag). check_paths=False
    skips what looks at files and devices (a saved config's values only)."""
    _check_numbers(c)
    _check_data(c, check_paths)
    _check_model(c, check_paths)
    if c.device == "cuda" and check_paths and tg.cuda.unavailable_reason() is not None:
        raise UsageError(tg.cuda.unavailable_reason())
    if c.device not in ("cpu", "cuda"):
        raise UsageError(f"--device must be cpu or cuda, got {c.device!r}")
    if c.dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {c.dtype!r}")


def _check_numbers(c: TrainConfig) -> None:
    for name in sorted(n for n, f in FIELDS.items() if kind(f) is float):
        v = getattr(c, name)
        if v is not None and not math.isfinite(v):
            raise UsageError(f"{_flag(name)} must be a finite number, got {v}")
    if not 0 <= c.seed < 2**63:
        raise UsageError(f"--seed must be in 0..2**63-1, got {c.seed}")
    for name in POSITIVE:
        v = getattr(c, name)
        if v is not None and v <= 0:
            raise UsageError(f"{_flag(name)} must be positive, got {v}")
    for name, top in LIMITS.items():
        if (getattr(c, name) or 0) > top:
            raise UsageError(f"{_flag(name)} must be at most {top:,}, got {getattr(c, name):,}")
    for name in NON_NEGATIVE:
        if getattr(c, name) < 0:
            raise UsageError(f"{_flag(name)} must be >= 0, got {getattr(c, name)}")
    if not c.lr > 0:
        raise UsageError(f"--lr must be positive, got {c.lr}")
    if c.min_lr > c.lr:
        raise UsageError(f"--min-lr ({c.min_lr}) must not exceed --lr ({c.lr})")
    for name in ("beta1", "beta2"):
        if not 0.0 <= getattr(c, name) < 1.0:
            raise UsageError(f"--{name} must be in [0, 1), got {getattr(c, name)}")
    if c.dropout is not None and not 0.0 <= c.dropout < 1.0:
        raise UsageError(f"--dropout must be in [0, 1), got {c.dropout}")


def _check_data(c: TrainConfig, check_paths: bool) -> None:
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
    for name in ("data", "out_dir", "init_from"):
        check_utf8_name(_flag(name), getattr(c, name))
    if check_paths:
        check_data_path(c.data)
        if c.out_dir and Path(c.out_dir).exists() and not Path(c.out_dir).is_dir():
            raise UsageError(f"--out-dir {c.out_dir} exists and is not a directory")


def _check_model(c: TrainConfig, check_paths: bool) -> None:
    if c.init_from is not None:
        if check_paths and source_problem(c.init_from) is not None:
            raise UsageError(f"--init-from {source_problem(c.init_from)}")
        for name in ("n_layer", "n_head", "n_embd"):
            if getattr(c, name) is not None:
                raise UsageError(
                    f"{_flag(name)} cannot change a pretrained "
                    "GPT-2 (--init-from); only --block-size and --dropout can"
                )
        return
    if c.preset not in PRESETS:
        raise UsageError(f"unknown --preset {c.preset!r}; choose one of {', '.join(PRESETS)}")
    m = {**PRESETS[c.preset], **model_overrides(c)}
    if m["n_embd"] % m["n_head"]:
        raise UsageError(
            f"n_embd ({m['n_embd']}) must be divisible by n_head "
            f"({m['n_head']}); set --n-embd / --n-head accordingly"
        )


def check_utf8_name(flag: str, path: str | None) -> None:
    """A file name that is not UTF-8 (its undecodable bytes arrive as lone surrogates) cannot
    go into the run's JSON, cache key and messages: refuse it, showing the bytes."""
    if path is None:
        return
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise UsageError(
            f"{flag} {shown}: the name is not valid UTF-8; rename it (or link to it) "
            "with a UTF-8 name"
        ) from None


def check_data_path(path: str | None) -> None:
    """--data must be a text file or a folder: not a FIFO (reading one blocks), a device
    (/dev/zero never ends) or an empty file (which would surface as a block-size problem)."""
    if path is None:
        return
    if is_hf_spec(path):
        try:
            parse_hf_spec(path)
        except ValueError as e:
            raise UsageError(f"--data {e}") from None
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


def num_params_text(n: int) -> str:
    return f"{n / 1e6:,.2f}M" if n >= 1e5 else f"{n:,}"


def check_fits(c: TrainConfig, config: GPTConfig) -> None:
    """Refuse a configuration whose training step cannot fit in the available memory."""
    need = estimate_bytes(config, c.batch_size)
    check_memory(
        need,
        f"this configuration ({num_params_text(n_params(config))} parameters, "
        f"batch {c.batch_size} x {config.block_size} tokens)",
        UsageError,
    )


def planned_config(c: TrainConfig) -> GPTConfig:
    """The model a fresh run will build, before its data is prepared (vocabulary guessed:
    --vocab-size or 4096 for BPE, 256 for characters; --init-from's, checked with its header)."""
    if c.init_from:
        mc = check_hf_dir(resolve(c.init_from))  # a hub name: fetched into the hub cache
        return dataclasses.replace(mc, block_size=c.block_size or mc.block_size)
    vocab = (c.vocab_size or 4096) if c.tokenizer == "bpe" else 256
    return GPTConfig.from_preset(c.preset, vocab_size=vocab, **model_overrides(c))
