"""GPTConfig: the model's hyperparameters, with GPT-2 and small named presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class GPTConfig:
    block_size: int = 1024  # longest sequence (number of learned positions)
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and LayerNorms, as GPT-2
    gelu: str = "tanh"  # 'tanh' (GPT-2's approximation) or 'none' (exact erf GELU)
    tie_weights: bool = True  # logits = H·Eᵀ with the token embedding E
    layer_norm_eps: float = 1e-5

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Refuse nonsense up front, with one line naming the field."""
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {v!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig: n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.gelu not in ("tanh", "none"):
            raise ValueError(f"GPTConfig.gelu must be 'tanh' or 'none', got {self.gelu!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"GPTConfig: unknown keys {unknown}")
        return cls(**d)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> GPTConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        d = dict(PRESETS[name])
        d.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**d)


_GPT2 = dict(block_size=1024, vocab_size=50257, bias=True, gelu="tanh")
PRESETS: dict[str, dict] = {
    "gpt2": dict(_GPT2, n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(_GPT2, n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(_GPT2, n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(_GPT2, n_layer=48, n_head=25, n_embd=1600),  # 1558M
    # nanoGPT's character-level Shakespeare model
    "shakespeare-char": dict(
        block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2
    ),
    # the default `gpt-train` model: 10-22 minutes on 2 CPU cores (README)
    "char-small": dict(block_size=128, vocab_size=65, n_layer=4, n_head=4, n_embd=128, dropout=0.0),
    # for tests and `gpt-explain`
    "tiny": dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16),
}
