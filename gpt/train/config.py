"""gpt-train's configuration: one dataclass whose fields carry their flag's help.

Each field's metadata gives the argparse group, help and metavar (or choices); the flag's
type comes from the annotation. Adding an option is one field here: the parser, the type
checks of a --config file and the checkpoint's train_config all follow from it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..config import PRESETS
from ..hfdata import is_spec as is_hf_spec
from ..hfdata import slug as hf_slug

DTYPES = {"float32": "highest", "tf32": "tf32", "bf16": "bf16"}  # -> set_matmul_precision
MODEL_FIELDS = ("preset", "n_layer", "n_head", "n_embd", "block_size", "dropout")
# what a resumed run keeps from its checkpoint, whatever the flags say
FIXED_ON_RESUME = ("dataset", "data", "tokenizer", "vocab_size", "init_from", "seed", *MODEL_FIELDS)


class UsageError(Exception):
    """A bad flag or value; main prints the message as one line and exits 2."""


def opt(default, group: str, help: str, metavar: str | None = None, choices=None, show=True):
    """A TrainConfig field: its default and its flag's group, help and metavar or choices.
    show: append "(default X)" to the help."""
    meta = {"group": group, "help": help, "metavar": metavar, "choices": choices, "show": show}
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    # data
    dataset: str = opt(
        "shakespeare",
        "data",
        "built-in corpus, downloaded once into the cache ($GPT_CACHE_DIR or "
        "~/.cache/tensorgrad-gpt)",
        choices=("shakespeare",),
    )
    data: str | None = opt(
        None,
        "data",
        "train on your own UTF-8 text: a file, or a folder of .txt files; or on a folder of "
        "GPT-2 token shards (fineweb .npy or llm.c .bin, split by 'train'/'val' in their names); "
        "or hf:NAME[:CONFIG][@SIZE], a Hugging Face dataset's text column streamed once into "
        "the cache (needs `pip install datasets`; e.g. hf:roneneldan/TinyStories@200MB)",
        "PATH",
    )
    tokenizer: str = opt(
        "char",
        "data",
        "char: one token per character; bpe: byte-level BPE trained on the data",
        choices=("char", "bpe"),
    )
    vocab_size: int | None = opt(None, "data", "BPE vocabulary size (default 4096)", "N")
    # model: a preset, individual overrides (None = the preset's), or a GPT-2 to fine-tune
    preset: str = opt(
        "char-small",
        "model",
        f"model size: one of {', '.join(PRESETS)}; the vocabulary size always comes from "
        "the tokenizer",
        "NAME",
    )
    n_layer: int | None = opt(None, "model", "transformer blocks (default: the preset's)", "N")
    n_head: int | None = opt(None, "model", "attention heads; must divide --n-embd", "N")
    n_embd: int | None = opt(None, "model", "embedding width", "N")
    block_size: int | None = opt(
        None, "model", "context length in tokens (with --init-from: crop GPT-2's 1024)", "N"
    )
    dropout: float | None = opt(None, "model", "dropout probability in [0, 1)", "X")
    init_from: str | None = opt(
        None,
        "model",
        "fine-tune a Hugging Face GPT-2 directory (config.json, model.safetensors, "
        "vocab.json, merges.txt) or hub name (gpt2, gpt2-xl, owner/repo[@revision]: fetched "
        "into the hub cache, needs the hf extra); its tokenizer is used",
        "DIR|NAME",
    )
    # optimisation
    batch_size: int = opt(32, "optimisation", "sequences per micro-batch", "N")
    grad_accum: int = opt(1, "optimisation", "micro-batches per optimizer step", "N")
    max_iters: int = opt(3500, "optimisation", "optimizer steps in all: the run-length knob", "N")
    lr: float = opt(1e-3, "optimisation", "peak learning rate", "X")
    min_lr: float = opt(1e-4, "optimisation", "learning rate after decay", "X")
    warmup_iters: int = opt(100, "optimisation", "linear warmup steps", "N")
    lr_decay_iters: int | None = opt(
        None,
        "optimisation",
        "cosine decay from --lr to --min-lr ends here (default --max-iters)",
        "N",
    )
    weight_decay: float = opt(0.1, "optimisation", "AdamW decoupled weight decay on matrices", "X")
    beta1: float = opt(0.9, "optimisation", "AdamW beta1", "X")
    beta2: float = opt(0.99, "optimisation", "AdamW beta2", "X")
    grad_clip: float = opt(1.0, "optimisation", "clip the global gradient norm; 0 = off", "X")
    divergence_factor: float = opt(
        4.0,
        "optimisation",
        "stop (keeping the last sane checkpoint) when a training or validation loss exceeds "
        "X times the run's best and ln(vocab size), i.e. worse than uniform guessing; "
        "0 = only NaN/inf stop the run",
        "X",
    )
    # evaluation, output
    eval_interval: int = opt(250, "evaluation and output", "evaluate and checkpoint every N", "N")
    eval_iters: int = opt(20, "evaluation and output", "batches per split per evaluation", "N")
    out_dir: str | None = opt(
        None,
        "evaluation and output",
        "checkpoints, metrics.jsonl and loss.png go here "
        "(default out/<dataset>-<tokenizer>, e.g. out/shakespeare-char)",
        "DIR",
    )
    seed: int = opt(1337, "evaluation and output", "seeds init, dropout and batches", "N")
    device: str = opt(
        "cpu",
        "evaluation and output",
        "cpu, or cuda (needs CuPy: pip install -e '.[cuda]')",
        choices=("cpu", "cuda"),
    )
    dtype: str = opt(
        "float32",
        "evaluation and output",
        "matmul precision on the GPU: float32, or tf32 / bf16 tensor cores; weights and AdamW "
        "state stay float32 (the CPU always uses float32)",
        choices=tuple(DTYPES),
    )
    compile: bool = opt(
        True,
        "evaluation and output",
        "trace the model's forward and replay it (tensorgrad.compile, as nanoGPT's --compile; "
        "default on); --no-compile runs every op eagerly",
    )
    diagnose: bool = opt(
        False,
        "evaluation and output",
        "check at the first step that every parameter gets a finite nonzero gradient, and log "
        "per-layer gradient norms and update/weight ratios every evaluation",
        show=False,
    )
    sample_tokens: int = opt(500, "evaluation and output", "tokens of the final sample", "N")


def kind(f: dataclasses.Field) -> type:
    """A field's value type (int, float, str or bool), read from its annotation."""
    return {"int": int, "float": float, "str": str, "bool": bool}[str(f.type).split(" ")[0]]


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def check_types(c: dict) -> None:
    """Check the values of a config layer against the field types (ints may be floats)."""
    for k, v in c.items():
        t = kind(FIELDS[k])
        if v is None and t is not bool:
            continue
        if t is bool and not isinstance(v, bool):
            raise UsageError(f"{k} must be true or false, got {v!r}")
        if t is int and (not isinstance(v, int) or isinstance(v, bool)):
            raise UsageError(f"{k} must be an integer, got {v!r}")
        if t is float:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise UsageError(f"{k} must be a number, got {v!r}")
            c[k] = float(v)
        if t is str and not isinstance(v, str):
            raise UsageError(f"{k} must be a string, got {v!r}")


def model_overrides(c: TrainConfig) -> dict:
    """The model fields given explicitly (n_layer, ...), to apply over the preset."""
    return {k: getattr(c, k) for k in MODEL_FIELDS[1:] if getattr(c, k) is not None}


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-") or "data"


def run_name(c: dict) -> str:
    """'shakespeare-char', 'notes-bpe', 'notes-gpt2': names the out and data directories."""
    data = c.get("data")
    if is_hf_spec(data):  # hf:org/stories@1.5GB: 'stories-1500MB' (not a file name's stem)
        name = _slug(hf_slug(data))
    else:
        name = _slug(Path(data).stem) if data else c.get("dataset") or "shakespeare"
    tok = _slug(Path(c["init_from"]).name) if c.get("init_from") else c.get("tokenizer", "char")
    return f"{name}-{tok}"
