"""``python -m gpt``: list the commands."""

import sys

COMMANDS = (
    ("gpt-train", "train a GPT (or fine-tune GPT-2) on text; `gpt-train --help`"),
    ("gpt-sample", "generate text from a trained run or a GPT-2 checkpoint"),
    ("gpt-explain", "show one training step stage by stage (--steps, --serve: watch it learn)"),
    ("gpt-plot", "redraw a run's loss.png from its metrics.jsonl"),
    ("gpt-export", "write a run as a Hugging Face GPT-2 directory transformers loads"),
)


def main() -> int:
    print("gpt: a GPT-2 on tensorgrad. Commands:")
    for name, what in COMMANDS:
        print(f"  {name:<12} {what}")
    print("Each takes --help.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
