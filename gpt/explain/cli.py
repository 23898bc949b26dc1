"""The gpt-explain command: one step (text, JSON, HTML), --steps N, or --serve.

Exit codes: 0 done; 2 a usage error (a bad option, a layer or position outside the model, a
prompt too short, a limit exceeded: the message names it); 1 a runtime failure (a checkpoint
that does not load, a file that cannot be written). When only the --graph picture cannot be
rendered (no Graphviz), the explanation is still printed, the failure is one line on stderr,
and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import tensorgrad as tg

from ..config import PRESETS, GPTConfig
from ..hub import resolve
from ..model import GPT
from ..store.errors import CheckpointError
from ..store.run_checkpoint import load_model_and_optimizer
from ..tokenizer import load_tokenizer_dir
from . import run
from .render.html import render_html
from .render.plots import save_steps_png
from .render.steps import render_steps_html, render_steps_text
from .render.text import render_text
from .report import (
    DEFAULT_PROMPT,
    MAX_TOKENS,
    TOKEN_LIMIT,
    cut_prompt,
    explain,
    prompt_ids,
    prompt_tokenizer,
)
from .serve.calm import is_loopback
from .serve.server import serve
from .steps import follow_steps


def load(args):
    """(model, tokenizer, description, step settings) from --out-dir, --init-from, or a fresh
    preset model; the settings are the run's next AdamW step, or an assumed one (run.py)."""
    given = dict(lr=args.lr, weight_decay=args.weight_decay)  # None unless given
    if args.out_dir:
        model, tok, ckpt, d, state = load_model_and_optimizer(args.out_dir, which=args.which)
        where = "the checkpoint" if d == Path(args.out_dir) else "best/"
        return model, tok, f"trained run {d}", run.from_run(ckpt, state, where, **given)
    if args.init_from:
        src = resolve(args.init_from)  # a hub name is fetched into the hub cache
        return (
            GPT.from_pretrained(src),
            load_tokenizer_dir(src),
            f"GPT-2 checkpoint {args.init_from}",
            run.assumed("a GPT-2 checkpoint carries no optimizer", **given),
        )
    tok = prompt_tokenizer(args.prompt, args.tokenizer)
    # the prompt is cut to max_tokens
    n = min(len(tok.encode(cut_prompt(args.prompt, args.tokenizer))), args.max_tokens)
    base = GPTConfig.from_preset(args.preset)
    cfg = GPTConfig.from_preset(
        args.preset, vocab_size=tok.vocab_size, block_size=max(base.block_size, n - 1)
    )
    tg.manual_seed(args.seed)
    return (
        GPT(cfg),
        tok,
        f"fresh '{args.preset}' GPT, {args.tokenizer} tokenizer from the prompt",
        run.assumed("a fresh model has no run", **given),
    )


def _ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {s!r}"
        ) from None


def _follow(s: str):
    """'W_Q:3,5' (of --layer) or 'transformer.h.0.mlp.c_fc.weight:3,5'."""
    name, _, idx = s.partition(":")
    rc = _ints(idx)
    if not name or len(rc) != 2:
        raise argparse.ArgumentTypeError(f"--follow takes NAME:row,col (e.g. W_Q:3,5), got {s!r}")
    return name, rc[0], rc[1]


def _resolve_follow(specs, layer: int, C: int):
    """--follow specs as (label, parameter name, row, col); W_Q/W_K/W_V/W_O name block layer's."""
    if not specs:
        return None
    attn = f"transformer.h.{layer}.attn"
    out = []
    for name, r, c in specs:
        if name in ("W_Q", "W_K", "W_V"):
            out.append(
                (name, f"{attn}.c_attn.weight", r + C * ("W_Q", "W_K", "W_V").index(name), c)
            )
        elif name == "W_O":
            out.append((name, f"{attn}.c_proj.weight", r, c))
        else:
            out.append((name, name, r, c))
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gpt-explain",
        description="Run training steps of a GPT on a prompt and show every "
        "stage: tokens, embeddings, attention, MLP, logits, loss, gradients (checked by finite "
        "differences), AdamW; follow weights across --steps, or drive it in a local page with "
        "--serve.",
    )
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--out-dir", help="a gpt-train run directory (default: a fresh model)")
    src.add_argument(
        "--init-from",
        help="a Hugging Face GPT-2 directory (config.json, "
        "model.safetensors, vocab.json, merges.txt) or hub name (gpt2, owner/repo[@revision])",
    )
    ap.add_argument(
        "--which", choices=("best", "latest"), default="best", help="which checkpoint of --out-dir"
    )
    ap.add_argument(
        "--preset",
        default="tiny",
        help="config of the fresh model (vocab_size "
        "and block_size follow the tokenizer and the prompt)",
    )
    ap.add_argument(
        "--tokenizer",
        choices=("bpe", "char"),
        default="bpe",
        help="fresh model: BPE or characters, learned from the prompt",
    )
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"cut the prompt to this many tokens (default {MAX_TOKENS}, at most "
        f"{TOKEN_LIMIT}); the output grows with its square",
    )
    ap.add_argument("--layer", type=int, default=0, help="the block shown in full")
    ap.add_argument(
        "--heads",
        type=_ints,
        default=None,
        help="heads to show, e.g. 0,1 (the "
        "first is the one whose weights are checked and followed)",
    )
    ap.add_argument(
        "--position",
        type=int,
        default=None,
        help="token position whose values and prediction are shown (default last)",
    )
    ap.add_argument(
        "--element",
        type=_ints,
        default=None,
        help="row,col of the W_Q element worked through AdamW (default: largest gradient)",
    )
    ap.add_argument(
        "--checks",
        type=int,
        default=2,
        help="elements per matrix checked by float64 finite differences (0: no checks)",
    )
    _add_training_args(ap)
    ap.add_argument("--format", choices=("text", "json", "html"), default="text")
    ap.add_argument(
        "--full",
        action="store_true",
        help="text format: every section and every row (default: a summary that fits 100 "
        "columns and about 150 lines)",
    )
    ap.add_argument("-o", "--output", help="write here instead of stdout")
    ap.add_argument(
        "--graph",
        help="also write the autograd graph of the loss (.dot, or .svg/"
        ".png/.pdf with Graphviz installed)",
    )
    return ap


def _add_training_args(ap) -> None:
    """The step's hyperparameters, --steps and --serve."""
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help="the step's learning rate (default: with --out-dir the run's at its iteration, "
        "else 1e-3)",
    )
    ap.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="AdamW's weight decay on the matrices (default: with --out-dir the run's, else 0.1)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="train this many steps on the "
        "prompt and follow the chosen weights, the loss and the attention",
    )
    ap.add_argument(
        "--follow",
        type=_follow,
        action="append",
        default=None,
        help="with --steps/--serve: a weight to follow, NAME:row,col (W_Q, W_K, W_V, "
        "W_O of --layer, row and col within that matrix, or a parameter name); "
        "repeat for more (default: the largest-gradient element of W_Q, W_K, W_V "
        "of the first head)",
    )
    ap.add_argument(
        "--plot",
        default="gpt-explain-steps.png",
        help="with --steps in text mode: where the PNG plots go",
    )
    ap.add_argument(
        "--serve",
        action="store_true",
        help="a local page to step the model and "
        "watch it (http://127.0.0.1, a free port unless --port; see --host)",
    )
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument(
        "--host",
        default="127.0.0.1",
        help="with --serve: the address to listen on (default 127.0.0.1; another than "
        "loopback needs --allow-remote)",
    )
    ap.add_argument(
        "--allow-remote",
        action="store_true",
        help="with --serve: allow a --host other than loopback (anyone who can reach it "
        "can train the model)",
    )


def _check_args(ap, args):
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes that are not UTF-8 reach sys.argv as lone surrogates
        bad = args.prompt[e.start : e.end]
        try:
            shown = repr(bad.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError:  # a lone surrogate that stands for no byte
            shown = ascii(bad)
        ap.error(f"--prompt is not valid UTF-8 text ({shown} at character {e.start})")
    if args.element is not None and len(args.element) != 2:
        ap.error("--element takes row,col")
    if not 2 <= args.max_tokens <= TOKEN_LIMIT:
        ap.error(f"--max-tokens must be in 2..{TOKEN_LIMIT}, got {args.max_tokens}")
    if not (args.out_dir or args.init_from) and args.preset not in PRESETS:
        ap.error(f"unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}")
    if args.checks < 0:
        ap.error(f"--checks must be >= 0, got {args.checks}")
    if args.steps is not None and args.serve:
        ap.error("--steps and --serve are two modes: choose one")
    if args.steps is not None and args.graph:
        ap.error("--graph draws the graph of one step: not with --steps")
    if args.serve and (args.output or args.format != "text" or args.graph):
        ap.error("--serve shows its page in the browser: no --format, -o or --graph")
    if args.graph and Path(args.graph).suffix.lower() not in (".dot", ".svg", ".png", ".pdf"):
        ap.error(f"--graph writes .dot, .svg, .png or .pdf, not {args.graph!r}")
    if not 0 <= args.port <= 65535:
        ap.error(f"--port must be in 0..65535, got {args.port}")
    if not is_loopback(args.host) and not args.allow_remote:
        ap.error(f"--host {args.host} is not loopback: add --allow-remote to serve it")


def _graph(args, model, tok) -> str | None:
    """Write the autograd graph; on failure return the one-line reason (the step goes on)."""
    try:
        ids, _ = prompt_ids(tok, args.prompt, model.config.block_size, args.max_tokens)
        _, loss = model(np.asarray([ids[:-1]]), np.asarray([ids[1:]]))
        tg.viz.to_dot(loss, params=model, path=args.graph)
    except (RuntimeError, OSError) as e:
        model.zero_grad()
        return f"gpt-explain: the graph was not rendered ({e}); the explanation follows"
    return None


def _write(args, text: str) -> None:
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


def _run(args) -> int:
    try:
        model, tok, source, settings = load(args)
    except (CheckpointError, ValueError, OSError, RuntimeError, KeyError) as e:
        print(f"gpt-explain: could not load the model: {e}", file=sys.stderr)
        return 1
    C = model.config.n_embd
    head = args.heads[0] if args.heads else 0
    follow = _resolve_follow(args.follow, args.layer, C)
    session = dict(  # what the served page and --steps both follow
        layer=args.layer,
        head=head,
        settings=settings,
        seed=args.seed,
        max_tokens=args.max_tokens,
        follow=follow,
    )
    if args.serve:
        return serve(
            model,
            tok,
            args.prompt,
            checks=args.checks,
            port=args.port,
            source=source,
            host=args.host,
            **session,
        )
    if args.steps is not None:
        t = follow_steps(model, tok, args.prompt, args.steps, **session)
        t["source"] = source
        if args.format == "json":
            _write(args, json.dumps(t, indent=1, allow_nan=False) + "\n")
        elif args.format == "html":
            _write(args, render_steps_html(t))
        else:
            _write(args, render_steps_text(t, save_steps_png(t, args.plot)))
        return 0
    graph_error = _graph(args, model, tok) if args.graph else None
    if graph_error:
        print(graph_error, file=sys.stderr)
    report = explain(
        model,
        tok,
        args.prompt,
        layer=args.layer,
        heads=args.heads,
        position=args.position,
        seed=args.seed,
        element=args.element,
        max_tokens=args.max_tokens,
        checks=args.checks,
        follow=follow,
        optimizer=settings.optimizer(model),  # the run's next step, or the assumed one
        grad_clip=settings.grad_clip,
    )
    report["source"] = source
    report["optimizer"] = settings.report(model)
    if args.format == "json":
        text = json.dumps(report, indent=1, allow_nan=False) + "\n"
    elif args.format == "html":
        text = render_html(report)
    else:
        text = render_text(report, full=args.full)
    _write(args, text)
    return 1 if graph_error else 0


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)  # a usage error exits 2 here
    _check_args(ap, args)
    try:
        return _run(args)
    except ValueError as e:  # the options do not fit the model or the prompt
        print(f"gpt-explain: {e}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as e:
        print(f"gpt-explain: {e}", file=sys.stderr)
        return 1
