"""How fast the BPE tokenizer encodes, in MB of UTF-8 text per second, on one core.

    python -m benchmarks.tokenizer [--reps 5] [--vocab DIR] [--text FILE]

The text is the Shakespeare corpus gpt-train uses (5.06 MB, fetched into the cache on first
use), or ``--text``. The vocabulary is a byte-level BPE in GPT-2's format trained on every
other play, asked for GPT-2's 50,257 tokens (the plays run out of pairs at about 34,800), or
a GPT-2 tokenizer directory (``--vocab``: vocab.json + merges.txt). The ways, each on the
same text and vocabulary, in one process, taking turns, each repetition a fresh tokenizer
(an empty cache of pieces, as in a run of gpt-train's data preparation):

- ``python before``: gpt/tokenizer.py's encoder before 2026-12-07 (below, as it was): the
  `re` pattern with every Unicode range, and a `min` over pairs with a key function;
- ``python``: ``BPETokenizer(..., use_tiktoken=False)``, the encoder without tiktoken;
- ``tiktoken``: ``BPETokenizer(..., use_tiktoken=True)``, what runs when tiktoken is
  installed (the `tiktoken` extra);
- ``tiktoken alone``: a ``tiktoken.Encoding`` on the same ranks with GPT-2's own pattern
  (``\\p{L}`` of tiktoken's newer Unicode), tiktoken as nanoGPT's data preparation runs it.

Every way's ids are checked equal to ``python``'s. Each figure is the median of ``--reps``
in CPU seconds of the process (``time.process_time``: on a shared machine, the time the
encoder ran rather than the time it waited for a core); wall-clock medians are printed and
kept too. tiktoken encodes one text on one thread, as Python does, so both are per core.
The one-time costs (building the split patterns, `BPETokenizer`'s checks and tiktoken's
tables) are timed apart, in wall-clock seconds. Writes benchmarks/results/tokenizer-<date>.json
with the machine and the load average.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class EncoderBefore:
    """gpt/tokenizer.py's BPETokenizer.encode_ordinary as it was before 2026-12-07."""

    def __init__(self, tok):
        self._byte_ids = tok._byte_ids
        self._ranks = {pair: hit[:2] for pair, hit in tok._ranks.items()}
        from gpt.tokenizer import gpt2_split_pattern

        self._pattern = gpt2_split_pattern()
        self._cache: dict[str, list[int]] = {}

    def _bpe(self, piece: str) -> list[int]:
        no_merge = (float("inf"), -1)
        ids = [self._byte_ids[b] for b in piece.encode("utf-8", "surrogatepass")]
        ranks = self._ranks
        while len(ids) > 1:
            pair = min(itertools.pairwise(ids), key=lambda p: ranks.get(p, no_merge))
            hit = ranks.get(pair)
            if hit is None:
                break
            a, b = pair
            new = hit[1]
            merged, i, n = [], 0, len(ids)
            while i < n:
                if i + 1 < n and ids[i] == a and ids[i + 1] == b:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            ids = merged
        return ids

    def encode_ordinary(self, s: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for piece in self._pattern.findall(s):
            ids = cache.get(piece)
            if ids is None:
                ids = self._bpe(piece)
                if len(cache) < 200_000:
                    cache[piece] = ids
            out.extend(ids)
        return out


def load_inputs(args) -> tuple[str, str, object, float]:
    """(text, where it came from, tokenizer, seconds to train it or 0)."""
    from gpt.tokenizer import BPETokenizer

    docs = None
    if args.text:
        text, source = Path(args.text).read_text("utf-8"), args.text
    else:
        from gpt.data import read_shakespeare

        docs = read_shakespeare()
        text = "\n\n".join(t for _, t in docs)
        source = f"Shakespeare, {len(docs)} plays (gpt-train's corpus)"
    if args.vocab:
        return text, source, BPETokenizer.load(args.vocab), 0.0
    if docs is None:
        from gpt.data import read_shakespeare

        docs = read_shakespeare()
    t0 = time.perf_counter()
    tok = BPETokenizer.train("\n\n".join(t for _, t in docs[::2]), vocab_size=50257)
    return text, source, tok, time.perf_counter() - t0


def main(argv=None) -> int:
    from benchmarks import machine
    from gpt import tokenizer as T

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="repetitions per way (median)")
    ap.add_argument("--vocab", help="a GPT-2 tokenizer directory (vocab.json + merges.txt)")
    ap.add_argument("--text", help="a UTF-8 text file to encode instead of Shakespeare")
    args = ap.parse_args(argv)
    d = machine.describe()
    print(machine.summary(d))

    t0 = time.perf_counter()
    T.split_gpt2("warm")  # the `re` patterns (enumerating Unicode's classes): once a process
    T.gpt2_split_pattern()
    setup = {"python split patterns": time.perf_counter() - t0}
    text, source, tok, train_s = load_inputs(args)
    n_bytes = len(text.encode("utf-8"))
    vocab = (
        f"{args.vocab} ({tok.vocab_size:,} tokens)"
        if args.vocab
        else (
            f"BPE trained on every other play: {tok.vocab_size:,} tokens, "
            f"50,257 asked ({train_s:.1f} s)"
        )
    )
    print(f"text: {source}, {n_bytes / 1e6:.2f} MB; vocabulary: {vocab}")

    def python_before():
        return EncoderBefore(tok)

    def python():
        return T.BPETokenizer(tok.vocab, tok.merges, use_tiktoken=False)

    ways = {"python before": python_before, "python": python}
    try:
        import tiktoken
    except ImportError:
        tiktoken = None
        print(f"tiktoken is not installed ({T.TIKTOKEN_INSTALL}): its rows are left out")
    else:
        t0 = time.perf_counter()
        probe = T.BPETokenizer(tok.vocab, tok.merges)
        backend = probe.backend  # the checks, the probe of tiktoken's classes, its tables
        setup["tiktoken, first tokenizer in a process"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        T.BPETokenizer(tok.vocab, tok.merges).backend  # noqa: B018 (it chooses)
        setup["tiktoken, each further tokenizer"] = time.perf_counter() - t0
        if backend != "tiktoken":
            print(f"this vocabulary stays in Python ({probe.backend_reason}): no tiktoken rows")
        else:
            ranks, _ = probe._tiktoken_ranks()

            def with_tiktoken():
                t = T.BPETokenizer(tok.vocab, tok.merges, use_tiktoken=True)
                assert t.backend == "tiktoken"  # built outside the timing
                return t

            def tiktoken_alone():
                return tiktoken.Encoding(
                    name="alone", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={}
                )

            ways |= {"tiktoken": with_tiktoken, "tiktoken alone": tiktoken_alone}
    for name, s in setup.items():
        print(f"one-time: {name}: {s:.2f} s")

    times: dict[str, list[float]] = {w: [] for w in ways}
    walls: dict[str, list[float]] = {w: [] for w in ways}
    want = python().encode_ordinary(text)
    for rep in range(args.reps):
        order = list(ways.items())
        for name, make in order if rep % 2 == 0 else order[::-1]:  # turns, both ways round
            enc = make()  # outside the timing: a tokenizer is made once per run
            gc.collect()
            w0, t0 = time.perf_counter(), time.process_time()
            ids = enc.encode_ordinary(text)
            times[name].append(time.process_time() - t0)
            walls[name].append(time.perf_counter() - w0)
            del enc
            if ids != want:
                # "tiktoken alone" may split characters newer than Python's Unicode otherwise
                print(f"  {name}: ids differ from python's (rep {rep})", file=sys.stderr)
                if name != "tiktoken alone":
                    return 1
            del ids  # freed outside the next timing

    rows = []
    ref = statistics.median(times["tiktoken alone"]) if "tiktoken alone" in times else None
    print(
        f"\nencode_ordinary, {n_bytes / 1e6:.2f} MB, {len(want):,} tokens, "
        f"median of {args.reps} (CPU seconds; wall-clock after the runs' range):"
    )
    for name, ts in times.items():
        s, wall = statistics.median(ts), statistics.median(walls[name])
        row = {
            "way": name,
            "median_cpu_s": s,
            "mb_per_s": n_bytes / s / 1e6,
            "tokens_per_s": len(want) / s,
            "all_cpu_s": ts,
            "median_wall_s": wall,
            "all_wall_s": walls[name],
            "vs_tiktoken_alone": s / ref if ref else None,
        }
        rows.append(row)
        vs = f"  {row['vs_tiktoken_alone']:.2f}x tiktoken alone's time" if ref else ""
        print(
            f"  {name:<15} {s:6.2f} s {row['mb_per_s']:6.2f} MB/s "
            f"{row['tokens_per_s'] / 1e6:5.2f} M tokens/s  "
            f"(runs {min(ts):.2f}-{max(ts):.2f} s; wall {wall:.2f} s){vs}"
        )
    load = os.getloadavg()
    print(f"load average during the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    out = ROOT / "benchmarks" / "results" / f"tokenizer-{datetime.date.today():%Y%m%d}.json"
    report = {
        "machine": d,
        "text": source,
        "text_bytes": n_bytes,
        "tokens": len(want),
        "vocab": vocab,
        "vocab_size": tok.vocab_size,
        "tiktoken": getattr(tiktoken, "__version__", None) if tiktoken else None,
        "python": sys.version.split()[0],
        "setup_s": setup,
        "load_average": load,
        "results": rows,
    }
    out.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
