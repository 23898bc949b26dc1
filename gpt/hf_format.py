"""A GPT as a Hugging Face GPT-2 directory: config.json, model.safetensors, the tokenizer.

`save_pretrained(model, dir, tokenizer)` writes what transformers.GPT2LMHeadModel.from_pretrained
(and GPT.from_pretrained, bitwise) loads, and what tools built on that format start from.
GPT-2's files differ from our state_dict in two ways:

- its four matmul weights per block are Conv1D, stored (in, out): the transpose of nn.Linear's
  (out, in) that we keep;
- it always has biases, so a model built with bias=False gets zero biases (the same logits).

A tied unembedding is stored once, as transformer.wte.weight (transformers ties lm_head to it).
The tokenizer: a BPE one as GPT-2's vocab.json + merges.txt; a char one as a tokenizer.json
that the `tokenizers` library reads (see CharTokenizer.to_hf_json); each with a
tokenizer_config.json naming the class AutoTokenizer should build. The directory is written
whole and recorded in a manifest (see gpt.store.owned_dir): gpt-export writes only a new
directory or one it wrote itself, and nothing a user put there is deleted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from tensorgrad import to_numpy

from .store import model_code
from .store.checkpoint import atomic_write_bytes, atomic_write_json
from .store.owned_dir import write_dir
from .store.validate import expected_shapes
from .tokenizer import EOT, UNK, BPETokenizer, CharTokenizer

ACTIVATION = {"tanh": "gelu_new", "none": "gelu"}  # GPTConfig.gelu -> transformers' name
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json")


def hf_config_dict(config, eos_token_id: int | None = None, code: dict | None = None) -> dict:
    """config.json for a GPTConfig, with GPT-2's keys (n_ctx too, for older readers), and
    ``code``, the record of the model's code (gpt.store.model_code), when given."""
    c = config
    extra = {} if code is None else {model_code.HF_KEY: code}  # transformers keeps, ignores it
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": None,  # 4 * n_embd
        "activation_function": ACTIVATION[c.gelu],
        "layer_norm_epsilon": c.layer_norm_eps,
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.dropout,
        "initializer_range": 0.02,
        "scale_attn_weights": True,  # scores / sqrt(head size)
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": c.tie_weights,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "use_cache": True,
        "dtype": "float32",
        **extra,
    }


def hf_arrays(model) -> dict[str, np.ndarray]:
    """The model's weights under GPT-2's names and layout, float32 (see the module docstring)."""
    out = {}
    for name, p in model.named_parameters():  # a tied matrix once, as transformer.wte.weight
        a = np.asarray(to_numpy(p.array), dtype=np.float32)
        out[name] = np.ascontiguousarray(a.T if name.endswith(CONV1D) else a)
    gpt2 = dataclasses.replace(model.config, bias=True)
    for name, shape in expected_shapes(gpt2).items():
        if name not in out:  # a bias of a bias=False model
            out[name] = np.zeros(shape, np.float32)
    return out


def save_pretrained(
    model, directory, tokenizer=None, strict: bool = False, code: dict | None | str = "model"
) -> list[str]:
    """Write model (and tokenizer, when given) as the directory ``directory``; returns the file
    names written (the manifest last).

    code: the record of the code that trained the weights, kept in config.json so that
    GPT.from_pretrained can say when it loads them into other code: "model" (default) the
    model's own code, as it runs now; gpt-export passes its checkpoint's record (None for a
    checkpoint written before records were kept: none is written).

    The tokenizer must not have more ids than the model's vocabulary; its <|endoftext|> id
    becomes bos_token_id and eos_token_id. A new or empty directory, or one gpt wrote, is
    replaced whole (keeping a tokenizer saved there before when none is given now); into a
    directory holding other files, as transformers' save_pretrained does, only the files of
    these names are replaced, and a tokenizer file of the other kind that gpt did not write is
    refused rather than deleted. strict (gpt-export) refuses such a directory.
    """
    c = model.config
    if code == "model":
        code = model_code.model_code(model)
    eos, stale = None, ()
    if tokenizer is not None:
        if tokenizer.vocab_size > c.vocab_size:
            raise ValueError(
                f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocabulary "
                f"only {c.vocab_size}"
            )
        eos = tokenizer.special_tokens.get(EOT)
        stale = set(TOKENIZER_FILES) - {*tokenizer_files(tokenizer), "tokenizer_config.json"}
    from safetensors.numpy import save

    def fill(d: Path) -> list[str]:
        # the metadata transformers' own save_pretrained writes (some versions check it)
        data = save(hf_arrays(model), metadata={"format": "pt"})
        atomic_write_bytes(d / "model.safetensors", data)
        del data
        written = ["model.safetensors"]
        if tokenizer is not None:
            written += save_tokenizer(tokenizer, d, c.block_size)
        atomic_write_json(d / "config.json", hf_config_dict(c, eos, code))  # makes d a model
        return [*written, "config.json"]

    return write_dir(directory, fill, strict=strict, stale=stale, last="config.json")


def tokenizer_files(tokenizer) -> list[str]:
    """The files that hold a tokenizer of this kind (besides tokenizer_config.json)."""
    if isinstance(tokenizer, BPETokenizer):
        return ["vocab.json", "merges.txt"]
    if isinstance(tokenizer, CharTokenizer):
        return ["tokenizer.json"]
    raise ValueError(f"cannot export a {type(tokenizer).__name__}: only bpe and char")


def save_tokenizer(tokenizer, directory, max_length: int) -> list[str]:
    """The tokenizer's files (see the module docstring) into directory; returns their names."""
    d = Path(directory)
    if isinstance(tokenizer, BPETokenizer):
        tokenizer.save(d)
        names, cls, unk = ["vocab.json", "merges.txt"], "GPT2Tokenizer", EOT
    elif isinstance(tokenizer, CharTokenizer):
        atomic_write_json(d / "tokenizer.json", tokenizer.to_hf_json())
        names, cls, unk = ["tokenizer.json"], "PreTrainedTokenizerFast", UNK
    else:
        raise ValueError(f"cannot export a {type(tokenizer).__name__}: only bpe and char")
    has_eot = EOT in tokenizer.special_tokens
    config = {
        "tokenizer_class": cls,
        "model_max_length": max_length,
        "unk_token": unk if unk == UNK or has_eot else None,  # GPT-2's unk is <|endoftext|>
        "bos_token": EOT if has_eot else None,
        "eos_token": EOT if has_eot else None,
        "add_prefix_space": False,
    }
    atomic_write_json(d / "tokenizer_config.json", config)
    return [*names, "tokenizer_config.json"]
