"""Modules: registration, names, state dicts, modes, the layers, and a tiny MLP that learns."""

import numpy as np
import pytest
from helpers import assert_close, check_op

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln(x)))))


class Tiny(nn.Module):
    """GPT-shaped: embeddings, a ModuleDict with a ModuleList, a head tied to wte."""

    def __init__(self, vocab=5, d=4, n_layer=2):
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, d),
                "h": nn.ModuleList([Block(d) for _ in range(n_layer)]),
                "ln_f": nn.LayerNorm(d),
            }
        )
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying

    def forward(self, idx):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


BLOCK_NAMES = ["ln.weight", "ln.bias", "fc.weight", "fc.bias", "proj.weight"]
TINY_NAMES = (
    ["transformer.wte.weight"]
    + [f"transformer.h.{i}.{n}" for i in range(2) for n in BLOCK_NAMES]
    + ["transformer.ln_f.weight", "transformer.ln_f.bias"]
)


def test_named_parameters_dotted_and_shared_listed_once():
    m = Tiny()
    names = [n for n, _ in m.named_parameters()]
    assert names == TINY_NAMES
    params = list(m.parameters())
    assert len(params) == len({id(p) for p in params}) == len(TINY_NAMES)
    assert m.lm_head.weight is m.transformer.wte.weight
    assert m.num_parameters() == sum(p.numel() for p in params)


def test_module_registration():
    m = Tiny()
    assert set(dict(m.named_modules())) >= {
        "",
        "transformer",
        "transformer.h",
        "transformer.h.0",
        "transformer.h.1.fc",
        "lm_head",
    }
    assert len(m.transformer.h) == 2 and isinstance(m.transformer.h[1], Block)
    assert "wte" in m.transformer and list(m.transformer.keys()) == ["wte", "h", "ln_f"]
    assert [type(c).__name__ for c in m.children()] == ["ModuleDict", "Linear"]
    # reassigning or deleting an attribute updates the registry
    b = Block(3)
    b.fc = nn.Linear(3, 6, bias=False)
    assert "fc.bias" not in dict(b.named_parameters())
    del b.proj
    assert not any(n.startswith("proj") for n, _ in b.named_parameters())
    b.extra = tg.zeros(2)  # a plain tensor is not a parameter
    assert "extra" not in dict(b.named_parameters())


def test_module_without_super_init_fails_clearly():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(tg.zeros(2))

    with pytest.raises(RuntimeError, match="super"):
        Bad()


def test_parameter_requires_grad():
    p = nn.Parameter(tg.zeros(2))
    assert p.requires_grad and p.is_leaf and isinstance(p, tg.Tensor)


def test_state_dict_names_and_arrays():
    m = Tiny()
    sd = m.state_dict()
    assert list(sd) == TINY_NAMES + ["lm_head.weight"]  # a tied weight under both names
    assert all(isinstance(v, tg.Tensor) for v in sd.values())
    assert sd["transformer.h.0.fc.weight"].shape == (8, 4)
    assert sd["lm_head.weight"] is sd["transformer.wte.weight"]


def test_load_state_dict_roundtrip():
    a, b = Tiny(), Tiny()
    sd = {k: v.clone() for k, v in a.state_dict().items()}
    missing, unexpected = b.load_state_dict(sd)
    assert missing == [] and unexpected == []
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy(), err_msg=n)
    # Tensor values work too
    b.load_state_dict({k: tg.tensor(v) for k, v in sd.items()})


def _snapshot(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_load_state_dict_strict_errors_list_names_and_change_nothing():
    m = Tiny()
    before = _snapshot(m)
    sd = {k: np.zeros_like(v) for k, v in before.items()}
    del sd["transformer.h.1.fc.bias"]
    sd["transformer.h.9.fc.bias"] = np.zeros(8, np.float32)
    with pytest.raises(KeyError) as e:
        m.load_state_dict(sd)
    msg = str(e.value)
    assert "transformer.h.1.fc.bias" in msg and "transformer.h.9.fc.bias" in msg, msg
    for k, v in _snapshot(m).items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} changed by a failed load")
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert missing == ["transformer.h.1.fc.bias"] and unexpected == ["transformer.h.9.fc.bias"]
    assert np.all(m.transformer.h[0].fc.weight.detach().numpy() == 0)


def test_load_state_dict_shape_mismatch_names_parameter():
    m = Tiny()
    before = _snapshot(m)
    sd = {k: np.zeros_like(v) for k, v in before.items()}
    sd["transformer.h.0.proj.weight"] = np.zeros((8, 4), np.float32)  # transposed
    with pytest.raises(ValueError) as e:
        m.load_state_dict(sd)
    msg = str(e.value)
    assert "transformer.h.0.proj.weight" in msg and "(8, 4)" in msg and "(4, 8)" in msg, msg
    for k, v in _snapshot(m).items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} changed by a failed load")


def test_load_state_dict_keeps_dtype():
    m = nn.Linear(2, 3)
    m.load_state_dict({"weight": np.ones((3, 2)), "bias": np.zeros(3)})  # float64 in
    assert m.weight.dtype == np.float32 and m.bias.dtype == np.float32


def test_train_eval_propagate():
    m = Tiny()
    assert all(x.training for x in m.modules())
    assert m.eval() is m and not any(x.training for x in m.modules())
    m.train()
    assert all(x.training for x in m.modules())
    m.transformer.h.eval()
    assert m.training and not m.transformer.h[0].drop.training


def test_zero_grad():
    m = Tiny()
    F.cross_entropy(m(tg.tensor([[0, 1, 2]])).view(-1, 5), tg.tensor([1, 2, 3])).backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_tied_weight_gets_both_gradients():
    m = Tiny()
    m.eval()
    F.cross_entropy(m(tg.tensor([0, 1])), tg.tensor([3, 4])).backward()
    g = m.transformer.wte.weight.grad.numpy()
    # rows 3 and 4 are only ever used by the head, rows 0 and 1 by both
    assert np.all(g[3] != 0) and np.all(g[0] != 0)


# ----------------------------------------------------------------------------- layers


def test_linear():
    lin = nn.Linear(3, 4)
    assert lin.weight.shape == (4, 3) and lin.bias.shape == (4,)
    assert lin.weight.dtype == np.float32
    bound = 1 / np.sqrt(3)
    assert np.all(np.abs(lin.weight.detach().numpy()) <= bound) and np.all(
        np.abs(lin.bias.detach().numpy()) <= bound
    )
    x = tg.randn(2, 5, 3)
    assert_close(
        lin(x).detach().numpy(),
        x.detach().numpy() @ lin.weight.detach().numpy().T + lin.bias.detach().numpy(),
        atol=1e-6,
    )
    assert nn.Linear(3, 4, bias=False).bias is None
    assert [n for n, _ in nn.Linear(3, 4, bias=False).named_parameters()] == ["weight"]
    assert "in_features=3" in repr(lin)


def test_embedding():
    emb = nn.Embedding(5, 3)
    assert emb.weight.shape == (5, 3)
    idx = tg.tensor([[1, 4], [4, 4]])
    out = emb(idx)
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(
        out.detach().numpy(), emb.weight.detach().numpy()[idx.detach().numpy()]
    )
    out.sum().backward()
    np.testing.assert_array_equal(emb.weight.grad.numpy()[:, 0], [0, 1, 0, 0, 3])


@pytest.mark.parametrize("shape", [4, (2, 4)])
def test_layernorm_module(shape):
    ln = nn.LayerNorm(shape)
    ns = (shape,) if isinstance(shape, int) else shape
    assert (
        ln.weight.shape == ns
        and np.all(ln.weight.detach().numpy() == 1)
        and np.all(ln.bias.detach().numpy() == 0)
    )
    x = tg.randn(3, 2, 4)
    y = ln(x).detach().numpy()
    axes = tuple(range(3 - len(ns), 3))
    assert_close(y.mean(axes), np.zeros(y.mean(axes).shape), atol=1e-6)
    assert_close(y.var(axes), np.ones(y.var(axes).shape), atol=1e-3)
    assert nn.LayerNorm(4, bias=False).bias is None
    assert nn.LayerNorm(4, elementwise_affine=False).weight is None


def test_dropout_module_eval_is_identity():
    d = nn.Dropout(0.5)
    x = tg.randn(4, 4)
    assert d.eval()(x) is x
    y = d.train()(x).detach().numpy()
    assert np.any(y == 0) and np.all((y == 0) | np.isclose(y, 2 * x.detach().numpy()))
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_module(approximate):
    x = np.linspace(-3, 3, 7)
    check_op(
        lambda t: nn.GELU(approximate)(t),
        lambda a: F.gelu(tg.tensor(a), approximate).detach().numpy(),
        x,
    )


def test_sequential_relu():
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert [n for n, _ in net.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert net(tg.randn(5, 2)).shape == (5, 1)


# ----------------------------------------------------------------------------- training


def test_tiny_mlp_learns_xor_like_task():
    tg.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 2)).astype(np.float32)
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype(np.int64)  # XOR of the signs: not linear
    net = nn.Sequential(nn.Linear(2, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 2))
    xt, yt = tg.tensor(x), tg.tensor(y)
    lr, losses = 0.5, []
    for _ in range(150):
        loss = F.cross_entropy(net(xt), yt)
        net.zero_grad()
        loss.backward()
        with tg.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
        losses.append(loss.item())
    assert all(p.dtype == np.float32 for p in net.parameters())
    assert losses[-1] < 0.5 * losses[0], losses[::15]
    acc = (net(xt).argmax(-1).detach().numpy() == y).mean()
    assert acc > 0.9, acc
