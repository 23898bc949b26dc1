"""gpt-export: write a gpt-train run as a Hugging Face GPT-2 directory.

    gpt-export --out-dir out/shakespeare-char --to hf/shakespeare-char [--which best|latest]

The directory (config.json, model.safetensors, the tokenizer; see gpt.hf_format) loads with
transformers.GPT2LMHeadModel.from_pretrained(DIR), AutoTokenizer.from_pretrained(DIR), and
with GPT.from_pretrained(DIR) or --init-from DIR here. --to must be a new or empty directory,
or one gpt-export wrote (its gpt-export.json lists the files; see gpt.store.owned_dir): nothing
else is ever deleted or overwritten, and a re-export replaces the old one whole.
"""

from __future__ import annotations

import argparse
import sys

from .hf_format import save_pretrained
from .store import model_code
from .store.errors import CheckpointError
from .store.owned_dir import check, check_target
from .store.run_checkpoint import WHICH, load_model

CHAR_NOTE = (
    "char tokenizer: tokenizer.json is a `tokenizers` WordLevel vocabulary, one token per "
    "character (<|unk|> = 0 for characters the run never saw); "
    "transformers.AutoTokenizer.from_pretrained(DIR) loads it"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpt-export",
        description="Write a gpt-train run as a Hugging Face GPT-2 directory (config.json, "
        "model.safetensors, tokenizer) that transformers.GPT2LMHeadModel.from_pretrained loads.",
    )
    p.add_argument("--out-dir", required=True, help="the run directory gpt-train wrote")
    p.add_argument(
        "--to",
        required=True,
        help="the directory to write: a new or empty one, or one gpt-export wrote before "
        "(replaced whole); any other is refused",
    )
    p.add_argument(
        "--which",
        choices=WHICH,
        default="best",
        help="best (lowest validation loss; the latest when there is none yet) or latest",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        check_target(a.to)
    except ValueError as e:
        print(f"gpt-export: error: --to {e}", file=sys.stderr)
        return 2
    try:
        check(a.to, strict=True)  # before the run is read; checked again when written
    except (OSError, ValueError) as e:
        print(f"gpt-export: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    try:
        model, tok, ckpt, d = load_model(a.out_dir, which=a.which)
        # the record of the code that trained the run goes along (not this process's code)
        files = save_pretrained(model, a.to, tok, strict=True, code=ckpt.get(model_code.KEY))
    except (CheckpointError, OSError, ValueError) as e:
        print(f"gpt-export: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    c = model.config
    loss = ckpt.get("val_loss")
    print(
        f"exported {d} (iter {ckpt.get('iter')}, val loss "
        f"{'none yet' if loss is None else f'{loss:.4f}'}): "
        f"GPT-2 of {c.n_layer} layers, {c.n_embd} wide, vocabulary {c.vocab_size}, "
        f"context {c.block_size}"
    )
    print(f"wrote {', '.join(files)} to {a.to}")
    if tok.kind == "char":
        print(CHAR_NOTE)
    print(f"load it: transformers.GPT2LMHeadModel.from_pretrained({str(a.to)!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
