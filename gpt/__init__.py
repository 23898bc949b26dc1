"""gpt: a GPT-2 built on tensorgrad, with nanoGPT's names (``from gpt import GPT, GPTConfig``).

Commands: ``gpt-train`` (train or fine-tune), ``gpt-sample`` (generate text), ``gpt-explain``
(see inside one forward pass), ``gpt-export`` (a run as a Hugging Face directory); ``python -m
gpt`` lists them.
"""

from .config import PRESETS, GPTConfig
from .model import GPT

__all__ = ["GPT", "PRESETS", "GPTConfig"]
