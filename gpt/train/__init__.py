"""gpt-train: train a GPT on Shakespeare or on your own text, with checkpoints you can resume.

    gpt-train                                   # character-level Shakespeare
    gpt-train --data notes/ --tokenizer bpe --vocab-size 2048 --max-iters 500
    gpt-train --resume --out-dir out/shakespeare-char       # continue exactly where it stopped
    gpt-train --init-from gpt2 --data my.txt --lr 3e-5 --max-iters 200    # fine-tune GPT-2
    OPENBLAS_NUM_THREADS=1 mpiexec -n 2 gpt-train   # data parallel, same losses (gpt/dist_train.py)

The training step is `loop.train`; the rooms around it:

    config.py    TrainConfig: every option's default, type and help in one place
    flags.py     the parser built from it; defaults < checkpoint (--resume) < --config < flags
    checks.py    ranges, paths and the memory estimate, checked before any work
    setup.py     data, model, optimizer, samplers: built, or restored from the checkpoint
    state.py     RunState, the counters a checkpoint holds, and save_checkpoint
    loop.py      the loop: lr, forward, loss.backward(), reduce, clip, step, zero_grad, log
    evaluate.py  held-out losses, and evaluate-then-checkpoint (rewinding when it must)
    guards.py    Diverged: non-finite or runaway losses stop the run before it saves
    signals.py   SIGINT/SIGTERM become a flag the loop reads between steps
    progress.py  the progress bar, metrics.jsonl, loss.png and --diagnose
    cli.py       main: the run directory lock, exit codes, the final sample

Resuming is exact: the checkpoint holds the weights, the AdamW moments and step counts, the
tensorgrad RNG (dropout) and the batch samplers' generators, so N iterations in one run and
N/2 plus --resume give bitwise the same losses on CPU (with --lr-decay-iters fixed: the cosine
schedule otherwise follows --max-iters). An evaluation interrupted by a signal, or one off the
--eval-interval grid (at --max-iters), rewinds its samplers, so the resumed run repeats it or
draws what an uninterrupted run would; a checkpoint saved before its due evaluation says
"evaluated": false and the resumed run evaluates first.
"""

from .checks import validate
from .cli import main
from .config import TrainConfig, UsageError
from .flags import build_parser, resolve_config
from .setup import load_data

__all__ = [
    "TrainConfig",
    "UsageError",
    "build_parser",
    "load_data",
    "main",
    "resolve_config",
    "validate",
]
