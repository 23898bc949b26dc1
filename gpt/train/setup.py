"""Setting a run up: the data, the model and optimizer, the batch samplers, and (with
--resume) all of them restored from the checkpoint, so the loop continues bitwise."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import tensorgrad as tg
from tensorgrad.cuda import set_matmul_precision

from ..config import GPTConfig
from ..data import (
    default_cache_dir,
    load_tokenizer_from_dir,
    prepare,
    read_shakespeare,
    read_text_path,
)
from ..hfdata import is_spec as is_hf_spec
from ..hfdata import text_file as hf_text
from ..hub import resolve
from ..model import GPT
from ..optim import load_run_optimizer, run_optimizer
from ..shards import load_shards, make_sampler, shard_files
from ..store import model_code
from ..store import run_checkpoint as rc
from ..store.errors import CheckpointError
from ..store.lock import in_use
from ..tokenizer import load_tokenizer_dir, tokenizer_from_dict
from .checks import check_fits, num_params_text
from .config import DTYPES, TrainConfig, UsageError, model_overrides, run_name
from .state import RunState


@dataclass
class TrainRun:
    """Everything the loop works with. samplers: 'train' for the steps, 'val' and
    'train_eval' (its own generator, so evaluating never changes the training batches)."""

    c: TrainConfig
    ddp: object  # dist_train.Run: this process's rank (one, without mpiexec)
    out: Path
    data_dir: Path
    meta: dict
    tok: object
    model_config: GPTConfig
    model: GPT
    optimizer: object
    samplers: dict
    state: RunState
    metrics: object = None
    code: dict | None = None  # the model's code (gpt.store.model_code), saved in checkpoints

    @property
    def params(self) -> list:
        return list(self.model.parameters())


def load_data(c: TrainConfig, fixed_tok=None) -> tuple[Path, dict, object]:
    """(prepared data directory, its meta, tokenizer). fixed_tok: tokenize with this one.
    A folder of token shards (gpt.shards) is read where it is, with GPT-2's tokenizer."""
    if is_hf_spec(c.data):  # streamed once into the cache, then prepared as a text file
        return _prepared(c, read_text_path(hf_text(c.data, default_cache_dir())), fixed_tok)
    files = shard_files(c.data) if c.data else None
    if files is not None:
        if c.vocab_size is not None:
            raise UsageError("--vocab-size does not apply to token shards: GPT-2's vocabulary")
        return Path(c.data), *load_shards(c.data, files, fixed_tok)
    return _prepared(c, read_text_path(c.data) if c.data else read_shakespeare(), fixed_tok)


def _prepared(c: TrainConfig, docs: list, fixed_tok) -> tuple[Path, dict, object]:
    name = run_name(dataclasses.asdict(c))
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


def pretrained(c: TrainConfig) -> GPT:
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


def clear_checkpoint(out: Path) -> None:
    """--overwrite: delete the run's checkpoints (ckpt.json first: never half of one)."""
    for d in (out / rc.BEST_DIR, out):
        (d / rc.CKPT_JSON).unlink(missing_ok=True)
        for f in [*d.glob("model-*.safetensors"), *d.glob("optim-*.safetensors")]:
            f.unlink(missing_ok=True)  # (another rank may delete it first)


def check_out_dir(out: Path, resumed: bool, overwrite: bool) -> None:
    """Refuse an --out-dir whose metrics.jsonl or loss.png gpt-train would replace unasked:
    one that is not a regular file (a device, a FIFO), or a directory that is not a run (no
    checkpoint) holding them, unless --overwrite says so."""
    names = [n for n in ("metrics.jsonl", "loss.png") if os.path.lexists(out / n)]
    for n in names:
        if os.path.exists(out / n) and not os.path.isfile(out / n):
            raise UsageError(f"{out / n} is not a regular file: choose another --out-dir")
    if names and not resumed and not overwrite and not rc.has_checkpoint(out):
        busy = in_use(out)  # another gpt-train writing its first steps there: say that
        if busy:
            raise UsageError(busy)
        raise UsageError(
            f"{out} holds {'/'.join(names)} but no gpt-train checkpoint: choose another "
            "--out-dir or pass --overwrite"
        )


def _data(c: TrainConfig, ckpt: dict | None, ddp) -> tuple[Path, dict, object]:
    """The prepared data; a fine-tune keeps GPT-2's tokenizer, a resumed run the same text."""
    fixed_tok = None
    if ckpt is not None and c.init_from:
        fixed_tok = tokenizer_from_dict(ckpt["tokenizer"])
    elif c.init_from:
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
    return data_dir, meta, tok


def _model(c: TrainConfig, ckpt: dict | None, tok, meta: dict) -> GPT:
    """The model to train: the checkpoint's shape, GPT-2 from --init-from, or a preset."""
    model = None
    if ckpt is not None:
        model_config = GPTConfig.from_dict(ckpt["model_config"])
    elif c.init_from:
        model = pretrained(c)
        model_config = model.config
    else:
        model_config = GPTConfig.from_preset(
            c.preset, vocab_size=tok.vocab_size, **model_overrides(c)
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
    return model or GPT(model_config)


def _restore(r: TrainRun) -> None:
    """Weights, AdamW state, samplers and RNG from the checkpoint in r.out."""
    ckpt, arrays, optim_state = rc.load(r.out)
    if optim_state is None:
        raise CheckpointError(f"the checkpoint in {r.out} has no optimizer state to resume")
    try:
        r.model.load_state_dict(arrays)
        load_run_optimizer(r.optimizer, r.c, optim_state)  # betas, decay: the flags'
        for name, s in r.samplers.items():
            s.load_state_dict(ckpt["samplers"][name])
        tg.set_rng_state(ckpt["rng"])
    except (KeyError, ValueError, TypeError) as e:
        raise CheckpointError(f"the checkpoint in {r.out} does not fit this run ({e})") from None
    r.state = RunState.from_checkpoint(ckpt)


def check_code(ckpt: dict, code: dict | None, out: Path, allow: bool) -> None:
    """--resume into model code other than the checkpoint's (gpt.store.model_code) is refused
    unless --allow-code-change; allowed, one line says so. A checkpoint without a record
    (written before it was kept) resumes quietly."""
    change = model_code.compare(ckpt.get(model_code.KEY), code)
    if change is None:
        return
    if not allow:
        raise UsageError(
            f"--resume: the model's code is not the code that trained the checkpoint in {out} "
            f"({change}); the resumed run would be another run. Restore that code, or add "
            "--allow-code-change to resume with this one"
        )
    print(
        f"gpt-train: note: resuming {out} with other model code than the checkpoint's "
        f"({change}), as --allow-code-change asks",
        file=sys.stderr,
    )


def setup(c: TrainConfig, ckpt: dict | None, control: dict, ddp) -> TrainRun | None:
    """The run, ready for its loop (restored with --resume); None when a resumed run is
    already finished (it says so)."""
    out = Path(c.out_dir)
    if ckpt is None and rc.has_checkpoint(out):
        if not control["overwrite"]:
            raise UsageError(
                f"{out} already holds a checkpoint: add --resume to continue it, "
                "--overwrite to start afresh, or choose another --out-dir"
            )
        clear_checkpoint(out)
    tg.manual_seed(c.seed)
    data_dir, meta, tok = _data(c, ckpt, ddp)
    model = _model(c, ckpt, tok, meta)
    code = model_code.model_code(model)  # the code that runs (before tg.compile wraps it)
    if ckpt is not None:
        check_code(ckpt, code, out, control.get("allow_code_change", False))
    model.to(c.device)
    if c.compile:
        tg.compile(model)  # traced at the first steps, replayed after (progress says what)
    set_matmul_precision(DTYPES[c.dtype])
    optimizer = run_optimizer(model, c)
    T = model.config.block_size
    samplers = {
        "train": make_sampler(data_dir, meta, "train", T, c.batch_size, seed=c.seed),
        "val": make_sampler(data_dir, meta, "val", T, c.batch_size, seed=c.seed + 1),
        "train_eval": make_sampler(data_dir, meta, "train", T, c.batch_size, seed=c.seed + 2),
    }
    r = TrainRun(c, ddp, out, data_dir, meta, tok, model.config, model, optimizer, samplers,
                 RunState(), code=code)  # fmt: skip
    if ckpt is not None:
        _restore(r)
        s = r.state
        if s.iter >= c.max_iters and s.evaluated_at == s.iter:
            if ddp.is_main:
                print(
                    f"the run in {out} is finished (iter {s.iter} of --max-iters "
                    f"{c.max_iters}); raise --max-iters (and set --lr-decay-iters) to train "
                    f"it further, or sample it: {sample_command()} --out-dir "
                    f"{shlex.quote(str(out))}",
                    file=sys.stderr,
                )
            return None
    return r


def describe(r: TrainRun) -> None:
    """The three lines on stderr before the loop: data, model, training."""
    c, mc, meta, tok = r.c, r.model_config, r.meta, r.tok
    what = f"GPT-2 from {c.init_from}" if c.init_from else f"preset {c.preset}"
    err = sys.stderr
    print(
        f"data: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens, "
        f"{tok.kind} vocabulary of {tok.vocab_size} ({r.data_dir})",
        file=err,
    )
    print(
        f"model: {r.model.num_params(non_embedding=False):,} parameters, "
        f"{num_params_text(r.model.num_params())} without the position embeddings as nanoGPT "
        f"counts ({what}: n_layer "
        f"{mc.n_layer}, n_head {mc.n_head}, n_embd {mc.n_embd}, block_size {mc.block_size}, "
        f"dropout {mc.dropout})",
        file=err,
    )
    resuming = f"; resuming at iter {r.state.iter}" if r.state.saved_at is not None else ""
    print(
        f"training: {c.max_iters} iterations of {c.batch_size} x {mc.block_size} tokens x "
        f"{c.grad_accum} accum = {tokens_per_iter(r):,} tokens, lr {c.lr} -> {c.min_lr}, "
        f"on {c.device}; out: {r.out}{resuming}",
        file=err,
    )


def tokens_per_iter(r: TrainRun) -> int:
    return r.c.batch_size * r.model_config.block_size * r.c.grad_accum


def command(*args: str) -> str:
    """How the user invoked us (gpt-train or python -m gpt.train), with args."""
    prog = "gpt-train" if Path(sys.argv[0]).name == "gpt-train" else "python -m gpt.train"
    return " ".join([prog, *map(shlex.quote, args)])


def resume_command(c: TrainConfig) -> str:
    extra = ["--device", c.device] if c.device != "cpu" else []
    return command("--resume", "--out-dir", c.out_dir, *extra)


def sample_command() -> str:
    return "gpt-sample" if Path(sys.argv[0]).name == "gpt-train" else "python -m gpt.sample"
