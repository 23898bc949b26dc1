"""Tests for GPT.from_pretrained: HF GPT-2 directories against an independent NumPy forward pass."""

import json
import math

import numpy as np
import pytest
from safetensors.numpy import save_file

from gpt.model import GPT
from gpt.store.errors import CheckpointError

N_LAYER, N_HEAD, C, BS, V = 2, 2, 16, 16, 32
HF_CONFIG = {
    "n_layer": N_LAYER,
    "n_head": N_HEAD,
    "n_embd": C,
    "n_positions": BS,
    "vocab_size": V,
    "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new",
}


def hf_weights(seed=0) -> dict:
    """Random float32 arrays in the HF GPT-2 layout: Conv1D weights are (in, out)."""
    g = np.random.default_rng(seed)

    def r(*shape, scale=0.3, mean=0.0):
        return (mean + scale * g.standard_normal(shape)).astype(np.float32)

    w = {
        "wte.weight": r(V, C),
        "wpe.weight": r(BS, C, scale=0.1),
        "ln_f.weight": r(C, scale=0.1, mean=1.0),
        "ln_f.bias": r(C, scale=0.1),
    }
    for i in range(N_LAYER):
        h = f"h.{i}."
        w |= {
            h + "ln_1.weight": r(C, scale=0.1, mean=1.0),
            h + "ln_1.bias": r(C, scale=0.1),
            h + "attn.c_attn.weight": r(C, 3 * C),
            h + "attn.c_attn.bias": r(3 * C, scale=0.1),
            h + "attn.c_proj.weight": r(C, C),
            h + "attn.c_proj.bias": r(C, scale=0.1),
            h + "attn.bias": np.tril(np.ones((BS, BS), np.float32))[None, None],  # mask buffer
            h + "ln_2.weight": r(C, scale=0.1, mean=1.0),
            h + "ln_2.bias": r(C, scale=0.1),
            h + "mlp.c_fc.weight": r(C, 4 * C),
            h + "mlp.c_fc.bias": r(4 * C, scale=0.1),
            h + "mlp.c_proj.weight": r(4 * C, C),
            h + "mlp.c_proj.bias": r(C, scale=0.1),
        }
    return w


def write_dir(path, weights, config=None, prefix="", head=False):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(HF_CONFIG if config is None else config))
    arrays = {prefix + k: v for k, v in weights.items()}
    if head:
        arrays["lm_head.weight"] = weights["wte.weight"].copy()
    save_file(arrays, str(path / "model.safetensors"))
    return path


# ----------------------------------------------------------------------------- reference


def ln(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def gelu_exact(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def reference_logits(w, idx, gelu=gelu_tanh):
    """GPT-2 forward in float64 from the HF arrays, written from the paper, not from gpt.model."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    T = idx.shape[1]
    hs = C // N_HEAD
    x = w["wte.weight"][idx] + w["wpe.weight"][np.arange(T)]
    future = np.triu(np.ones((T, T), bool), k=1)
    for i in range(N_LAYER):
        b = {n[len(f"h.{i}.") :]: a for n, a in w.items() if n.startswith(f"h.{i}.")}
        a = (
            ln(x, b["ln_1.weight"], b["ln_1.bias"]) @ b["attn.c_attn.weight"]
            + b["attn.c_attn.bias"]
        )
        heads = []
        for j in range(N_HEAD):
            q, k, v = (a[:, :, s * C + j * hs : s * C + (j + 1) * hs] for s in range(3))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hs)
            s[:, future] = -np.inf
            e = np.exp(s - s.max(-1, keepdims=True))
            heads.append((e / e.sum(-1, keepdims=True)) @ v)
        x = x + np.concatenate(heads, -1) @ b["attn.c_proj.weight"] + b["attn.c_proj.bias"]
        m = ln(x, b["ln_2.weight"], b["ln_2.bias"]) @ b["mlp.c_fc.weight"] + b["mlp.c_fc.bias"]
        x = x + gelu(m) @ b["mlp.c_proj.weight"] + b["mlp.c_proj.bias"]
    x = ln(x, w["ln_f.weight"], w["ln_f.bias"])
    return x @ w["wte.weight"].T


def model_logits(model, idx):
    return model(idx, np.zeros_like(idx))[0].array  # with targets: every position


# ----------------------------------------------------------------------------- loading


@pytest.mark.parametrize(
    "prefix,head", [("", False), ("transformer.", False), ("transformer.", True)]
)
def test_logits_match_reference(tmp_path, prefix, head):
    w = hf_weights()
    model = GPT.from_pretrained(write_dir(tmp_path / "gpt2", w, prefix=prefix, head=head))
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size) == (
        N_LAYER,
        N_HEAD,
        C,
        BS,
        V,
    )
    assert cfg.gelu == "tanh" and cfg.tie_weights and cfg.dropout == 0.0
    idx = np.random.default_rng(1).integers(0, V, (2, BS))
    np.testing.assert_allclose(
        model_logits(model, idx), reference_logits(w, idx), rtol=1e-4, atol=1e-4
    )


def test_exact_gelu_config(tmp_path):
    w = hf_weights(2)
    model = GPT.from_pretrained(write_dir(tmp_path, w, dict(HF_CONFIG, activation_function="gelu")))
    assert model.config.gelu == "none"
    idx = np.random.default_rng(3).integers(0, V, (2, 9))
    got = model_logits(model, idx)
    np.testing.assert_allclose(got, reference_logits(w, idx, gelu_exact), rtol=1e-4, atol=1e-4)
    assert np.abs(got - reference_logits(w, idx, gelu_tanh)).max() > 1e-4  # the choice matters


def test_pytorch_bin_only_asks_for_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02not really a pickle")
    with pytest.raises(CheckpointError, match="safetensors"):
        GPT.from_pretrained(tmp_path)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere"):
        GPT.from_pretrained(tmp_path / "nowhere")


def test_missing_config_json(tmp_path):
    write_dir(tmp_path, hf_weights())
    (tmp_path / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        GPT.from_pretrained(tmp_path)


def test_missing_config_key(tmp_path):
    cfg = dict(HF_CONFIG)
    del cfg["n_head"]
    with pytest.raises(CheckpointError, match="n_head"):
        GPT.from_pretrained(write_dir(tmp_path, hf_weights(), cfg))


@pytest.mark.parametrize("bad", [{"n_head": 3}, {"activation_function": "relu"}])
def test_bad_config_value(tmp_path, bad):
    key = next(iter(bad))
    with pytest.raises(CheckpointError, match=key):
        GPT.from_pretrained(write_dir(tmp_path, hf_weights(), dict(HF_CONFIG, **bad)))


def test_corrupt_safetensors(tmp_path):
    write_dir(tmp_path, hf_weights())
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 8 + b"garbage, not a header")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        GPT.from_pretrained(tmp_path)


def test_missing_or_misshapen_tensor(tmp_path):
    w = hf_weights()
    del w["h.1.ln_2.bias"]
    with pytest.raises(CheckpointError, match=r"h\.1\.ln_2\.bias"):
        GPT.from_pretrained(write_dir(tmp_path / "a", w))
    w = hf_weights()
    w["h.0.mlp.c_fc.weight"] = w["h.0.mlp.c_fc.weight"][:, :10].copy()
    with pytest.raises(CheckpointError, match=r"c_fc\.weight"):
        GPT.from_pretrained(write_dir(tmp_path / "b", w))
