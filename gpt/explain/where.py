"""Where each stage of gpt-explain's step is computed: the file, the line range and the code there.

``WHERE`` maps a stage (the last part of a report stage's key, e.g. ``att`` for ``h0.att``, or a
backward/optimizer step such as ``adamw``) to the places that compute it, each
``(file relative to the repository root, first line, last line, a piece of code in those lines)``.
The renderers show them beside each stage (``where(key)``); tests/test_explain_story.py checks
that every range still holds its code, so a moved line fails a test instead of pointing a reader
at the wrong place.
"""

from __future__ import annotations

MODEL = "gpt/model.py"
NN = "tensorgrad/ops/nn.py"

WHERE: dict[str, list[tuple[str, int, int, str]]] = {
    # the forward pass, in the model and in the reference ops
    "tok_emb": [(MODEL, 246, 246, "self.transformer.wte(idx)"), (NN, 238, 254, "class Embedding")],
    "pos_emb": [(MODEL, 246, 246, "self.transformer.wpe(pos)")],
    "x": [(MODEL, 246, 246, "self.transformer.wte(idx) + self.transformer.wpe(pos)")],
    "ln_1": [(MODEL, 107, 107, "self.ln_1(x)"), (NN, 150, 175, "class LayerNorm")],
    "qkv": [
        (MODEL, 59, 59, "self.c_attn(x)"),
        ("tensorgrad/ops/linalg.py", 63, 89, "class Linear"),
    ],
    "q": [(MODEL, 59, 59, "q, k, v = self.c_attn(x).split(self.n_embd, dim=2)")],
    "k": [(MODEL, 59, 59, "q, k, v = self.c_attn(x).split(self.n_embd, dim=2)")],
    "v": [(MODEL, 59, 59, "q, k, v = self.c_attn(x).split(self.n_embd, dim=2)")],
    "q_heads": [(MODEL, 60, 60, "q = q.view(B, T, nh, hs).transpose(1, 2)")],
    "k_heads": [(MODEL, 61, 61, "k = k.view(B, T, nh, hs).transpose(1, 2)")],
    "v_heads": [(MODEL, 62, 62, "v = v.view(B, T, nh, hs).transpose(1, 2)")],
    "scores": [(MODEL, 72, 72, "(q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))")],
    "masked": [(MODEL, 73, 74, 'att.masked_fill(~tg.Tensor(allowed), float("-inf"))')],
    "att": [(MODEL, 75, 75, "F.softmax(att, dim=-1)"), (NN, 48, 63, "class Softmax")],
    "att_out": [(MODEL, 77, 77, "y = att @ v")],
    "merged": [(MODEL, 78, 78, "y.transpose(1, 2).contiguous().view(B, T, C)")],
    "attn_proj": [(MODEL, 79, 79, "self.c_proj(y)")],
    "resid_1": [(MODEL, 107, 107, "x = x + self.attn(self.ln_1(x)")],
    "ln_2": [(MODEL, 108, 108, "self.ln_2(x)"), (NN, 150, 175, "class LayerNorm")],
    "fc": [(MODEL, 91, 91, "self.c_fc(x)")],
    "gelu": [(MODEL, 91, 91, "self.gelu("), (NN, 184, 212, "class Gelu")],
    "mlp_proj": [(MODEL, 91, 91, "self.c_proj(self.gelu(self.c_fc(x)))")],
    "resid_2": [(MODEL, 108, 108, "return x + self.mlp(self.ln_2(x))")],
    "ln_f": [(MODEL, 252, 252, "self.transformer.ln_f(x)")],
    "logits": [(MODEL, 255, 255, "F.linear(x, self.unembedding)")],
    "probs": [(NN, 48, 63, "class Softmax")],
    "loss": [(MODEL, 261, 261, "F.cross_entropy("), (NN, 112, 136, "class CrossEntropy")],
    # the backward pass and the update
    "backward": [("tensorgrad/autograd/engine.py", 155, 179, "def run_walk")],
    "wqkv_grad": [("tensorgrad/ops/linalg.py", 87, 94, "gw = matmul(_mT(g2), x2)")],
    "embedding_grad": [(NN, 252, 254, "return add_at(self.wshape, idx")],
    "adamw": [("tensorgrad/optim/__init__.py", 205, 221, "def adamw_update")],
    "finite_differences": [("gpt/explain/checks.py", 59, 116, "def finite_differences")],
    "loss_change": [("gpt/explain/checks.py", 119, 141, "def loss_change")],
}


def where(key: str) -> list[tuple[str, int, int, str]]:
    """The places that compute stage ``key`` (a report stage key such as 'h0.att', or a name
    of WHERE); [] when none is recorded."""
    return WHERE.get(key.split(".")[-1], [])
