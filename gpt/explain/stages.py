"""The stages of a recorded forward (gpt.explain.record), named as a reader of GPT-2 knows them.

``stages(root, model, layer)`` walks what ran and gives each module output and each group of
ops a key: ``tok_emb``, ``pos_emb``, ``x``, then per block ``h{i}.ln_1``, ``qkv``, ``q``/``k``/
``v``, ``q_heads``..., ``scores``, ``masked``, ``att``, ``att_out``, ``merged``, ``attn_proj``,
``resid_1``, ``ln_2``, ``fc``, ``gelu`` (the MLP's activation), ``mlp_proj``, ``resid_2``, then
``ln_f`` and ``logits``. A key comes from where the tensor was made (which module, which op,
what came before: the ops after the softmax that multiply by v are ``att_out``), never from a
line number. Each stage's name and formula are GPT-2's (``GLOSS``) only when the ops that ran
are the ones the formula describes; otherwise they say what ran (``relu``, ``max(0, x)``, or
the statement itself). What matches nothing gets a key of its own (``h0.div``): an edit adds
a stage, and a stage the code no longer computes is simply absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad.autograd import record_ops

from .arrays import host, rms
from .record import Call, OpGroup
from .where import definition

BTC, HEADS, TT = ("B", "T", "C"), ("B", "nh", "T", "hs"), ("B", "nh", "T", "T")
LN = "(x - mean)/std · γ + β"
# key -> (name, formula, axes, the ops the formula describes)
GLOSS = {
    "tok_emb": ("token embedding", "wte[x]: row x_t of E", BTC, {"Embedding"}),
    "pos_emb": ("position embedding", "wpe[t] for t = 0..T-1", ("1", "T", "C"), {"Embedding"}),
    "x": ("embedding sum", "tok_emb + pos_emb", BTC, {"Add"}),
    "ln_1": ("ln_1", LN, BTC, {"LayerNorm"}),
    "qkv": ("c_attn", "ln_1 · [W_Q; W_K; W_V]ᵀ + b", ("B", "T", "3C"), {"Linear"}),
    "q": ("q", "qkv[..., 0:C] = ln_1 · W_Qᵀ + b_Q", BTC, {"Split"}),
    "k": ("k", "qkv[..., C:2C] = ln_1 · W_Kᵀ + b_K", BTC, {"Split"}),
    "v": ("v", "qkv[..., 2C:3C] = ln_1 · W_Vᵀ + b_V", BTC, {"Split"}),
    "q_heads": ("q heads", "q.view(B, T, nh, hs).transpose(1, 2)", HEADS, {"Reshape", "Permute"}),
    "k_heads": ("k heads", "the same split for k", HEADS, {"Reshape", "Permute"}),
    "v_heads": ("v heads", "the same split for v", HEADS, {"Reshape", "Permute"}),
    "scores": ("scores", "q · kᵀ / √hs", TT, {"Permute", "MatMul", "Mul", "Div"}),
    "masked": ("masked scores", "scores, -inf where key s > query t (the future)", TT,
               {"MaskedFill"}),
    "att": ("attention weights", "softmax over keys: rows sum to 1, future = 0", TT,
            {"Softmax"}),
    "att_out": ("attention output", "att · v", HEADS, {"MatMul"}),
    "merged": ("merged heads", "heads side by side: transpose(1, 2).view(B, T, C)", BTC,
               {"Permute", "Contiguous", "Reshape"}),
    "attn_proj": ("c_proj (W_O)", "merged · W_Oᵀ + b_O", BTC, {"Linear"}),
    "resid_1": ("residual 1", "x + attention", BTC, {"Add"}),
    "ln_2": ("ln_2", LN, BTC, {"LayerNorm"}),
    "fc": ("MLP c_fc", "ln_2 · W_fcᵀ + b_fc", ("B", "T", "4C"), {"Linear"}),
    "gelu": ("GELU", "GELU(c_fc) = x·Φ(x)", ("B", "T", "4C"), {"Gelu"}),
    "mlp_proj": ("MLP c_proj", "GELU · W_projᵀ + b_proj", BTC, {"Linear"}),
    "resid_2": ("residual 2", "x + MLP: the block's output", BTC, {"Add"}),
    "ln_f": ("ln_f", "final LayerNorm: H", BTC, {"LayerNorm"}),
    "logits": ("logits", "H · W_lmᵀ", ("B", "T", "V"), {"Linear"}),
}  # fmt: skip
OP_FORMULA = {  # one op that ran where GPT-2 has another: what it computes
    "Relu": "max(0, x)",
    "Gelu": "x·Φ(x)",
    "Sigmoid": "1 / (1 + e^-x)",
    "Tanh": "tanh(x)",
    "Softmax": "softmax over the last axis",
    "LayerNorm": LN,
}
NAMED = {  # (role, leaf module name) -> key
    ("gpt", "wte"): "tok_emb", ("gpt", "wpe"): "pos_emb", ("gpt", "ln_f"): "ln_f",
    ("block", "ln_1"): "ln_1", ("block", "ln_2"): "ln_2",
    ("attn", "c_attn"): "qkv", ("attn", "c_proj"): "attn_proj",
    ("mlp", "c_fc"): "fc", ("mlp", "c_proj"): "mlp_proj",
}  # fmt: skip


def is_shape_op(cls) -> bool:
    """An op that moves or picks elements (view, transpose, gather, pad) rather than computing."""
    return cls.__module__.endswith((".shape", ".more_shape"))


@dataclass
class Forward:
    """The named stages of one recorded forward: ``stages`` (JSON-able, in the order they ran),
    ``tensors`` (key -> the model's tensor), the attention weights of every block (``atts``:
    (nh, T, T) each) and the one-line summary of every block (``blocks``)."""

    stages: list = field(default_factory=list)
    tensors: dict = field(default_factory=dict)
    atts: list = field(default_factory=list)
    blocks: list = field(default_factory=list)
    loss_where: list = field(default_factory=list)  # where the loss was computed


def roles(model) -> dict:
    """id(module) -> (role, block index) for the GPT, its blocks, attentions and MLPs."""
    out = {id(model): ("gpt", None)}
    for i, b in enumerate(model.transformer.h):
        out[id(b)] = ("block", i)
        for name in ("attn", "mlp"):
            if getattr(b, name, None) is not None:
                out[id(getattr(b, name))] = (name, i)
    return out


def stages(root: Call, model, layer: int) -> Forward:
    """The stages of ``root`` (gpt.explain.record.record): every one of block ``layer`` and of
    the model outside its blocks, a summary of each block, every block's attention weights."""
    c = model.config
    dims = {"B": 1, "1": 1, "C": c.n_embd, "3C": 3 * c.n_embd, "4C": 4 * c.n_embd}
    dims.update(nh=c.n_head, hs=c.n_embd // c.n_head, V=c.vocab_size, T=root.args[0].shape[-1])
    w = _Walk(roles(model), dims, model.lm_head is None)
    w.walk(root, "gpt", "", None)
    fw = Forward(loss_where=w.loss_where)
    for key, st, t in w.found:
        if st["block"] is None or st["block"] == layer:
            if t.requires_grad and not t.is_leaf:
                t.retain_grad()
            fw.stages.append(st)
            fw.tensors[key] = t
    for i, call in w.block_calls:
        att = w.tensors.get(f"h{i}.att")
        if att is None:
            raise ValueError(
                f"block {i} computes no attention weights that gpt-explain can show (no "
                "softmax in its attention's code)"
            )
        fw.atts.append(host(att)[0])
        out = call.output
        if i != layer and out.requires_grad:
            out.retain_grad()
        parts = {w.role_of(e): e.output for e in call.events if isinstance(e, Call)}
        fw.blocks.append(
            {
                "block": i,
                "full": i == layer,
                "tensor": out,
                "rms_in": rms(host(call.args[0])),
                "rms_attn": rms(host(parts["attn"])) if "attn" in parts else 0.0,
                "rms_mlp": rms(host(parts["mlp"])) if "mlp" in parts else 0.0,
                "rms_out": rms(host(out)),
            }
        )
    return fw


class _Walk:
    """Names the stages of a Call tree, in the order they ran (``found``)."""

    def __init__(self, roles: dict, dims: dict, tied: bool):
        self.roles, self.dims, self.tied = roles, dims, tied
        self.found, self.tensors, self.block_calls, self.loss_where = [], {}, [], []

    def role_of(self, call: Call) -> str | None:
        return self.roles.get(id(call.module), (None, None))[0]

    def walk(self, call: Call, role: str, prefix: str, block):
        state = {"adds": 0, "seen": set()}
        for ev in call.events:
            if isinstance(ev, Call) and not ev.leaf:
                sub, i = self.roles.get(id(ev.module), ("other", block))
                if sub == "block":
                    self.block_calls.append((i, ev))
                    self.walk(ev, sub, f"h{i}.", i)
                else:
                    self.walk(ev, sub, prefix if sub != "other" else f"{prefix}{ev.name}.", i)
                state["seen"].add(sub)
                continue
            tensors = ev.outputs if isinstance(ev, OpGroup) else (ev.output,)
            if not all(isinstance(t, tg.Tensor) for t in tensors):
                continue  # a module that returns a tuple: its parts show where they are used
            for key, t in zip(self.keys(role, ev, state, tensors), tensors):
                self.add(prefix + key, block, ev, t, state)

    def keys(self, role: str, ev, state: dict, tensors) -> list:
        """The keys GPT-2 has for ``ev``'s tensors (generic ones for what it does not)."""
        seen = state["seen"]
        if isinstance(ev, Call):
            key = NAMED.get((role, ev.name))
            if key is None and role == "mlp" and "fc" in seen and "mlp_proj" not in seen:
                key = "gelu"  # the MLP's activation module
            return [key or ev.name]
        names = {op.name for op in ev.ops}
        first = ev.ops[0].inputs[0] if ev.ops[0].inputs else None
        if role == "gpt":
            if "CrossEntropy" in names:
                return ["loss"]
            if "block" not in seen and "x" not in seen:
                return ["x"]
            if tensors[-1].shape[-1] == self.dims["V"] and "logits" not in seen:
                return ["logits"]
        elif role == "block" and "Add" in names:
            state["adds"] += 1
            return [f"resid_{state['adds']}"]
        elif role == "attn":
            if "Split" in names and len(tensors) == 3:
                state["qkv"] = {id(t): k for t, k in zip(tensors, "qkv")}
                return ["q", "k", "v"]
            which = state.get("qkv", {}).get(id(first))
            if which and tensors[-1].ndim == 4:
                return [f"{which}_heads"]
            if "Softmax" in names:
                return ["att"]
            if "MaskedFill" in names:
                return ["masked"]
            if "MatMul" in names or "Attention" in names:
                return ["att_out" if "att" in seen or "Attention" in names else "scores"]
            if "att_out" in seen and "merged" not in seen and tensors[-1].ndim == 3:
                return ["merged"]
        elif role == "mlp" and "fc" in seen and "mlp_proj" not in seen:
            return ["gelu"]
        return [ev.ops[-1].name.lower()] * len(tensors)

    def add(self, key: str, block, ev, t, state: dict):
        short = key.rsplit(".", 1)[-1]
        if short == "loss":
            self.tensors["loss"] = t
            self.loss_where = self.describe(key, short, block, ev, t)["where"]
            return
        if key in self.tensors:  # GPT-2 has this one already: what follows is new
            n = 2
            while f"{key}_{n}" in self.tensors:
                n += 1
            key, short = f"{key}_{n}", f"{short}_{n}"
        state["seen"].add(short)
        self.tensors[key] = t
        self.found.append((key, self.describe(key, short, block, ev, t), t))

    def describe(self, key: str, short: str, block, ev, t) -> dict:
        ops = ev.ops
        names = [op.name for op in ops]
        gloss = GLOSS.get(short)
        real = [op.name for op in ops if not is_shape_op(op.cls)]
        # the formula's ops, each once (x + attn + mlp in one statement is not 'x + attention')
        fits = bool(names) and gloss is not None and set(names) <= gloss[3]
        fits = fits and len(real) == len(set(real))
        if fits:
            name, formula, axes = gloss[0], gloss[1], gloss[2]
            formula = self.formula(short, ev, formula)
        else:
            name, formula, axes = _what_ran(ev), _formula_of(ev), ()
        if formula is None:  # the ops fit, the constants do not: the stage, as written
            formula = _formula_of(ev)
        if not self.fits(axes, t.shape):
            axes = self.guess_axes(t.shape)
        place = ev.place
        where = [list(place)] if place[1] else []
        for op in ops:
            d = None if is_shape_op(op.cls) else definition(op.cls)
            if d is not None and list(d) not in where:
                where.append(list(d))
        return {
            "key": key,
            "name": name,
            "block": block,
            "formula": formula,
            "shape": list(t.shape),
            "axes": list(axes),
            "ops": [op.ran for op in ops],
            "where": where,
        }

    def formula(self, short: str, ev, formula: str) -> str | None:
        if short == "logits" and self.tied:
            return "H · Eᵀ (tied to the token embedding)"
        if short == "scores":
            scale = _scale(ev.ops)
            hs = self.dims["hs"]
            if not math.isclose(scale, 1 / math.sqrt(hs), rel_tol=1e-6):
                return None
            return f"q · kᵀ / √hs  (√{hs} = {math.sqrt(hs):.4g})"
        if short == "mlp_proj":
            act = next(
                (st["name"] for k, st, _ in reversed(self.found) if k.endswith("gelu")), None
            )
            return f"{act or 'GELU'} · W_projᵀ + b_proj"
        return formula

    def fits(self, axes, shape) -> bool:
        return len(axes) == len(shape) and all(self.dims[a] == s for a, s in zip(axes, shape))

    def guess_axes(self, shape) -> tuple:
        """Axis names for a tensor GPT-2 does not have (an edit's): by their sizes."""
        d = self.dims
        if len(shape) == 4 and shape[1] == d["nh"] and shape[2] == d["T"]:
            return ("B", "nh", "T", "T" if shape[3] == d["T"] else "hs")
        if len(shape) == 3 and shape[1] == d["T"]:
            last = next((a for a in ("C", "3C", "4C", "V") if d[a] == shape[2]), "F")
            return ("B", "T", last)
        return tuple(f"d{i}" for i in range(len(shape)))


def _what_ran(ev) -> str:
    """A stage's name from what ran: the ops of a group ('relu', 'relu → pow'), or a leaf
    module's attribute and class ('ln_1 (RMSNorm)')."""
    if isinstance(ev, Call):
        return f"{ev.name} ({type(ev.module).__name__})"
    names = [op.name.lower() for op in ev.ops if not is_shape_op(op.cls)]
    names = names or [op.name.lower() for op in ev.ops]
    return " → ".join(n for k, n in enumerate(names) if k == 0 or n != names[k - 1])


def _formula_of(ev) -> str:
    """What ran as a formula: one op's (``max(0, x)``), else the statement that ran it."""
    ops = [op.name for op in ev.ops if not is_shape_op(op.cls)]
    if len(ops) == 1 and ops[0] in OP_FORMULA:
        return OP_FORMULA[ops[0]]
    return ev.place[3] or " → ".join(op.name for op in ev.ops)


def _scale(ops) -> float:
    """The product of the numbers an op group multiplies (or divides) by."""
    scale = 1.0
    for op in ops:
        numbers = [x for x in op.inputs if isinstance(x, (int, float, np.floating))]
        for x in numbers:
            if op.name == "Mul":
                scale *= float(x)
            elif op.name == "Div" and op.inputs[-1] is x:
                scale /= float(x)
            elif op.name == "Div":
                return math.nan
    return scale


def probabilities(fw: Forward, logits) -> None:
    """Add the ``probs`` stage: softmax of the logits over the vocabulary, which the report
    shows beside them (the loss takes the logits directly; this is not the model's)."""
    ran = []
    with record_ops(lambda cls, *rest: ran.append(cls)):
        probs = F.softmax(logits, dim=-1)
    place = definition(ran[-1]) if ran else None
    fw.tensors["probs"] = probs
    fw.stages.append(
        {
            "key": "probs",
            "name": "probabilities",
            "block": None,
            "formula": "softmax(logits) over the vocabulary (the loss takes the logits directly)",
            "shape": list(probs.shape),
            "axes": ["B", "T", "V"],
            "ops": [c.__name__ for c in ran],
            "where": [list(place)] if place else [],
        }
    )
