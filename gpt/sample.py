"""gpt-sample: generate text from a gpt-train run or a GPT-2 checkpoint, streamed as it comes.

    gpt-sample                                     # the best checkpoint of out/shakespeare-char
    gpt-sample --out-dir out/notes-bpe --which latest --prompt "Dear diary," --top-p 0.9
    gpt-sample --init-from gpt2 --prompt "Hello, I'm a language model," --num-samples 3

Tokens are printed as they are generated. Byte-level BPE tokens can end in the middle of a
UTF-8 character, so the text is decoded from all ids generated so far and only the part that
can no longer change is printed (a trailing U+FFFD waits for the rest of its bytes).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import warnings
from pathlib import Path

import tensorgrad as tg
from tensorgrad.compiler import CompileWarning

DEFAULT_OUT_DIR = "out/shakespeare-char"


class UsageError(Exception):
    """A bad flag or a missing input; main prints the message as one line and exits 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise UsageError(f"{message} (see {self.prog} --help)")


def start_ids(tok, prompt: str | None) -> list[int]:
    """Token ids to start from: the encoded prompt; without one, a newline for a character
    tokenizer that knows it (text starts mid-dialogue), else <|endoftext|> (a new document)."""
    if prompt:
        return tok.encode(prompt)
    if getattr(tok, "kind", "") == "char":
        ids = tok.encode("\n")
        if ids and 0 not in ids:
            return ids
    return [tok.eot_token_id]


def quiet_cache_steps(generate_stream):
    """``generate_stream`` without the compiler's line for its KV-cached steps: a step that
    appends to the cache runs eagerly by design (one position each; its ops are few), while
    the window past block_size, of one shape, replays compiled."""

    def run(*args, **kwargs):
        tokens = generate_stream(*args, **kwargs)
        while True:
            with warnings.catch_warnings():  # (around each step only: not while we yield)
                warnings.filterwarnings("ignore", "tensorgrad.compile: .*KVCache", CompileWarning)
                nxt = next(tokens, None)
            if nxt is None:
                return
            yield nxt

    return run


def stream_sample(
    model,
    tok,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 200,
    top_p: float | None = None,
    seed: int | None = None,
    out=None,
) -> str:
    """Generate one continuation of prompt_ids, writing its text to ``out`` (default stdout)
    piece by piece; stops early at <|endoftext|>. Returns the generated text."""
    import numpy as np

    out = sys.stdout if out is None else out
    eot = tok.special_tokens.get("<|endoftext|>")
    ids: list[int] = []
    shown = 0
    text = ""
    # the char tokenizer's unknown-character id is never wanted, nor ids of a padded
    # vocabulary that the tokenizer cannot decode
    suppress = [tok.unk_token_id] if getattr(tok, "unk_token_id", None) is not None else []
    suppress += range(tok.vocab_size, getattr(getattr(model, "config", None), "vocab_size", 0))
    stream = quiet_cache_steps(model.generate_stream)(
        np.array([prompt_ids], dtype=np.int64),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_token_id=eot,
        seed=seed,
        suppress_tokens=suppress or None,
    )
    for nxt in stream:
        t = int(nxt[0])
        if t == eot:
            break
        ids.append(t)
        text = tok.decode(ids)
        stable = len(text.rstrip("\ufffd"))  # an unfinished UTF-8 character may still complete
        if stable > shown:
            out.write(text[shown:stable])
            out.flush()
            shown = stable
    out.write(text[shown:])
    out.flush()
    return text


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="gpt-sample",
        description="Generate text from a gpt-train run (--out-dir) or a GPT-2 directory "
        "(--init-from), streaming tokens to stdout as they are sampled.",
    )
    src = p.add_argument_group("model")
    src.add_argument(
        "--out-dir", default=None, help=f"a gpt-train output directory (default {DEFAULT_OUT_DIR})"
    )
    src.add_argument(
        "--which",
        choices=("best", "latest"),
        default="best",
        help="which checkpoint of the run: 'best' (lowest validation loss, the "
        "default; falls back to latest if the run has none yet) or 'latest'",
    )
    src.add_argument(
        "--init-from",
        default=None,
        metavar="DIR|NAME",
        help="a Hugging Face GPT-2 directory (config.json, model.safetensors, "
        "vocab.json, merges.txt) or hub name (gpt2, gpt2-xl, owner/repo[@revision]; "
        "fetched into the hub cache, needs the hf extra) instead of a gpt-train run",
    )
    gen = p.add_argument_group("generation")
    gen.add_argument(
        "--prompt",
        default=None,
        help="text to continue (default: a newline for character models, "
        "<|endoftext|> otherwise, i.e. start a new document)",
    )
    gen.add_argument(
        "--prompt-file",
        default=None,
        metavar="FILE",
        help="read the prompt from a UTF-8 file instead",
    )
    gen.add_argument("--num-samples", type=int, default=3, help="how many samples (default 3)")
    gen.add_argument(
        "--max-new-tokens",
        type=int,
        default=500,
        help="tokens to generate per sample (default 500); a sample also ends "
        "when the model emits <|endoftext|>",
    )
    gen.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="divide the logits by this; <1 is more conservative, 0 is greedy (default 0.8)",
    )
    gen.add_argument(
        "--top-k",
        type=int,
        default=200,
        help="sample only from the k likeliest tokens (default 200; 0 = off)",
    )
    gen.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="nucleus sampling: the smallest set of tokens whose probability "
        "reaches p, in (0, 1] (default off)",
    )
    gen.add_argument(
        "--seed", type=int, default=1337, help="random seed; sample i uses seed + i (default 1337)"
    )
    gen.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where to run the model (cuda needs CuPy: pip install -e '.[cuda]')",
    )
    return p


def _validate(a) -> None:
    from .hub import source_problem

    if a.out_dir is not None and a.init_from is not None:
        raise UsageError("give either --out-dir or --init-from, not both")
    if a.prompt is not None and a.prompt_file is not None:
        raise UsageError("give either --prompt or --prompt-file, not both")
    if a.num_samples < 1:
        raise UsageError(f"--num-samples must be at least 1, got {a.num_samples}")
    if a.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {a.max_new_tokens}")
    if not a.temperature >= 0:
        raise UsageError(f"--temperature must be >= 0, got {a.temperature}")
    if a.top_k < 0:
        raise UsageError(f"--top-k must be >= 0 (0 = off), got {a.top_k}")
    if not math.isfinite(a.temperature):
        raise UsageError(f"--temperature must be a finite number, got {a.temperature}")
    if a.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {a.seed}")
    if a.top_p is not None and not 0.0 < a.top_p <= 1.0:
        raise UsageError(f"--top-p must be in (0, 1], got {a.top_p}")
    if a.init_from is not None and source_problem(a.init_from) is not None:
        raise UsageError(f"--init-from {source_problem(a.init_from)}")
    if a.prompt_file is not None and not Path(a.prompt_file).is_file():
        raise UsageError(f"--prompt-file {a.prompt_file} does not exist or is not a regular file")
    if a.device == "cuda" and tg.cuda.unavailable_reason() is not None:
        raise UsageError(tg.cuda.unavailable_reason())


def _load(a):
    """(model, tokenizer, description) for the chosen source."""
    from .hub import resolve
    from .model import GPT
    from .store.errors import CheckpointError
    from .store.run_checkpoint import has_checkpoint, load_model
    from .tokenizer import load_tokenizer_dir

    if a.init_from is not None:
        src = resolve(a.init_from)  # a hub name is fetched into the hub cache
        try:
            tok = load_tokenizer_dir(src)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot load the tokenizer of {a.init_from}: {e}") from None
        model = GPT.from_pretrained(src)
        if tok.vocab_size > model.config.vocab_size:
            raise CheckpointError(
                f"the tokenizer of {a.init_from} has {tok.vocab_size} tokens "
                f"but its model only {model.config.vocab_size}"
            )
        model.to(a.device)
        return model, tok, a.init_from
    out_dir = a.out_dir or DEFAULT_OUT_DIR
    if not has_checkpoint(out_dir) and not has_checkpoint(Path(out_dir) / "best"):
        raise UsageError(
            f"no checkpoint in {out_dir}: train one first (gpt-train --out-dir "
            f"{shlex.quote(out_dir)}) or pass --out-dir / --init-from"
        )
    model, tok, ckpt, d = load_model(out_dir, a.which, a.device)
    v = ckpt.get("val_loss")
    measured = isinstance(v, (int, float)) and ckpt.get("evaluated", True)
    loss = f"val loss {v:.4f}" if measured else "not evaluated at this iteration"
    where = f"{d} (iter {ckpt.get('iter')}, {loss})"
    if a.which == "best" and d.name != "best":  # the run stopped before its first best/
        where += ": best/ holds no checkpoint yet, so the latest"
    return model, tok, where


def main(argv: list[str] | None = None) -> int:
    from .store.errors import CheckpointError

    try:
        a = build_parser().parse_args(argv)
        _validate(a)
        prompt = a.prompt
        if a.prompt_file is not None:
            try:
                prompt = Path(a.prompt_file).read_text("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise UsageError(f"cannot read --prompt-file {a.prompt_file}: {e}") from None
        model, tok, where = _load(a)
        tg.compile(model)  # past block_size each token is a whole window: replayed compiled
    except UsageError as e:
        print(f"gpt-sample: error: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, OSError, ValueError) as e:  # a runtime failure, not a bad flag
        print(f"gpt-sample: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except MemoryError:
        print("gpt-sample: error: out of memory loading the model", file=sys.stderr)
        return 1
    ids = start_ids(tok, prompt)
    if getattr(tok, "kind", "") == "char" and 0 in ids:
        print(
            "gpt-sample: warning: the prompt has characters the model never saw in training "
            "(they become <|unk|>)",
            file=sys.stderr,
        )
    print(f"sampling from {where}", file=sys.stderr)
    try:
        for i in range(a.num_samples):
            if i:
                sys.stdout.write("\n---------------\n")
            if prompt:
                sys.stdout.write(prompt)
            stream_sample(
                model,
                tok,
                ids,
                a.max_new_tokens,
                a.temperature,
                a.top_k or None,
                a.top_p,
                seed=a.seed + i,
            )
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. piped into `head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
