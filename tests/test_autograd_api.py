"""The autograd API as users program it: grad, backward(create_graph), custom Functions,
tensor and module hooks, autograd.functional; each against hand-derived values."""

import numpy as np
import pytest
from helpers import assert_close

import tensorgrad as tg
import tensorgrad.nn.functional as F
from tensorgrad import nn
from tensorgrad.autograd import Function, functional, grad


def f64(*values, requires_grad=True):
    return tg.tensor(np.array(values, dtype=np.float64), requires_grad=requires_grad)


# ----------------------------------------------------------------------------- grad


def test_second_derivative_of_cube():
    x = f64(1.5, -2.0)
    (g,) = grad((x**3).sum(), x, create_graph=True)
    assert_close(g.detach().numpy(), 3 * x.detach().numpy() ** 2)
    (h,) = grad(g.sum(), x)
    assert_close(h.detach().numpy(), 6 * x.detach().numpy())
    assert x.grad is None  # grad returns, it never accumulates


def test_third_derivative_and_backward_create_graph():
    x = f64(0.7)
    (s1,) = grad(x.sin(), x, create_graph=True)
    (s2,) = grad(s1, x, create_graph=True)
    (s3,) = grad(s2, x)
    assert_close(s3.detach().numpy(), [-np.cos(0.7)])  # the third derivative of sin is -cos
    y = x.tanh()
    (g1,) = grad(y, x, create_graph=True)
    (g2,) = grad(g1, x, create_graph=True)
    (g3,) = grad(g2, x)
    t = np.tanh(0.7)
    assert_close(g1.detach().numpy(), [1 - t * t])
    assert_close(g2.detach().numpy(), [-2 * t * (1 - t * t)])
    assert_close(g3.detach().numpy(), [(1 - t * t) * (6 * t * t - 2)])
    z = f64(2.0)
    (z**4).sum().backward(create_graph=True)
    assert z.grad.requires_grad
    (h,) = grad(z.grad.sum(), z)
    assert_close(h.detach().numpy(), [12 * 4.0])


def test_grad_outputs_allow_unused_and_non_leaf_inputs():
    x, w = f64(1.0, 2.0), f64(3.0)
    h = x * 2
    y = h * h
    seed = tg.tensor([1.0, 10.0], dtype=tg.float64)
    gh, gx = grad(y, [h, x], grad_outputs=seed, retain_graph=True)
    assert_close(gh.detach().numpy(), [2 * 2.0, 10 * 2 * 4.0])
    assert_close(gx.detach().numpy(), [8.0, 10 * 8 * 2.0])
    with pytest.raises(RuntimeError, match="not used"):
        grad(y.sum(), [x, w])
    gx2, gw = grad((x * x).sum(), [x, w], allow_unused=True)
    assert gw is None and gx2 is not None


def test_retain_graph_defaults_to_create_graph():
    x = f64(1.0)
    y = (x.exp() * x).sum()
    grad(y, x)
    with pytest.raises(RuntimeError, match="second time"):
        grad(y, x)
    y = (x.exp() * x).sum()
    grad(y, x, create_graph=True)
    grad(y, x)  # still there


def test_newtons_method_finds_the_minimum():
    # f(x) = x⁴/4 - x: f'(x) = x³ - 1, f''(x) = 3x², the minimum is at x = 1
    x = f64(3.0)
    for _ in range(30):
        (d1,) = grad((x**4 / 4 - x).sum(), x, create_graph=True)
        (d2,) = grad(d1.sum(), x)
        x = (x - d1 / d2).detach().requires_grad_()
    assert_close(x.detach().numpy(), [1.0], atol=1e-12)


def test_gradient_penalty_gradient():
    # f = Σ w·x², ∇ₓf = 2wx, penalty = ‖∇ₓf‖² = Σ 4w²x², d penalty/dw = 8wx²
    x, w = f64(0.5, -1.0, 2.0), f64(1.0, 2.0, -0.5)
    (gx,) = grad((w * x * x).sum(), x, create_graph=True)
    penalty = (gx * gx).sum()
    penalty.backward()
    assert_close(w.grad.detach().numpy(), 8 * w.detach().numpy() * x.detach().numpy() ** 2)
    assert_close(x.grad.detach().numpy(), 8 * w.detach().numpy() ** 2 * x.detach().numpy())


def tiny_mlp(seed=0):
    r = np.random.default_rng(seed)
    w1 = tg.tensor(r.standard_normal((3, 4)), dtype=tg.float64)
    w2 = tg.tensor(r.standard_normal((4,)), dtype=tg.float64)
    return lambda x: (F.gelu(x @ w1).tanh() @ w2).sum()


def test_hvp_of_a_tiny_mlp_matches_the_explicit_hessian():
    f = tiny_mlp()
    x = tg.tensor(np.random.default_rng(1).standard_normal((2, 3)), dtype=tg.float64)
    v = tg.tensor(np.random.default_rng(2).standard_normal((2, 3)), dtype=tg.float64)
    H = functional.hessian(f, x).detach().numpy().reshape(6, 6)
    assert_close(H, H.T, atol=1e-12, what="symmetric")

    # the Hessian by finite differences of the gradient
    def gradient(a):
        t = tg.tensor(a, dtype=tg.float64, requires_grad=True)
        return grad(f(t), t)[0].detach().numpy().reshape(-1)

    eps, a = 1e-6, x.detach().numpy().reshape(-1)
    fd = np.stack(
        [
            (gradient((a + eps * e).reshape(2, 3)) - gradient((a - eps * e).reshape(2, 3)))
            / (2 * eps)
            for e in np.eye(6)
        ]
    )
    assert_close(H, fd, atol=1e-6, rtol=1e-5, what="hessian vs finite differences")
    value, hv = functional.hvp(f, x, v)
    assert_close(hv.detach().numpy().reshape(-1), H @ v.detach().numpy().reshape(-1), atol=1e-10)
    assert_close(value.detach().numpy(), f(x).detach().numpy())


def test_jacobian_vjp_jvp():
    x = f64(1.0, 2.0, 3.0)
    J = functional.jacobian(lambda t: t * t, x)
    assert_close(J.detach().numpy(), np.diag(2 * x.detach().numpy()))
    A = np.arange(6.0).reshape(2, 3)
    fn = lambda t: tg.tensor(A, dtype=tg.float64) @ t.exp()  # noqa: E731
    want = A * np.exp(x.detach().numpy())[None, :]
    assert_close(functional.jacobian(fn, x).detach().numpy(), want)
    u = tg.tensor([1.0, -2.0], dtype=tg.float64)
    v = tg.tensor([0.5, 1.0, -1.0], dtype=tg.float64)
    _, vj = functional.vjp(fn, x, u)
    assert_close(vj.detach().numpy(), u.detach().numpy() @ want)
    _, jv = functional.jvp(fn, x, v)
    assert_close(jv.detach().numpy(), want @ v.detach().numpy())
    Ja, Jb = functional.jacobian(lambda a, b: a * b, (x, v))
    assert_close(Ja.detach().numpy(), np.diag(v.detach().numpy()))
    assert_close(Jb.detach().numpy(), np.diag(x.detach().numpy()))
    assert_close(
        functional.hessian(lambda t: (t**3).sum(), x).detach().numpy(),
        np.diag(6 * x.detach().numpy()),
    )


def test_functional_create_graph_keeps_the_result_differentiable():
    x = f64(1.0, 2.0)
    _, vj = functional.vjp(lambda t: (t**3).sum(), x, create_graph=True)
    assert vj.requires_grad
    (g,) = grad(vj.sum(), x)
    assert_close(g.detach().numpy(), 6 * x.detach().numpy())


# ----------------------------------------------------------------------------- Function


class Cube(Function):
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x * x * scale

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 3 * x * x * ctx.scale, None


class SplitSigns(Function):
    """Two outputs (positive and negative parts) and an integer one, not differentiable."""

    @staticmethod
    def forward(ctx, x):
        pos, neg = x.relu(), -((-x).relu())
        count = (x > 0).long().sum()
        ctx.mark_non_differentiable(count)
        ctx.save_for_backward(x)
        return pos, neg, count

    @staticmethod
    def backward(ctx, gp, gn, gc):
        (x,) = ctx.saved_tensors
        return tg.where(x > 0, gp, gn)


def test_custom_function_like_torch():
    x = f64(1.0, -2.0)
    y = Cube.apply(x, 2.0)
    assert_close(y.detach().numpy(), 2 * x.detach().numpy() ** 3)
    y.sum().backward(create_graph=True)
    assert_close(x.grad.detach().numpy(), 6 * x.detach().numpy() ** 2)
    (h,) = grad(x.grad.sum(), x)  # the backward was written with tensor ops: differentiable
    assert_close(h.detach().numpy(), 12 * x.detach().numpy())
    assert tg.gradcheck(lambda t: Cube.apply(t, 0.5), [f64(0.3, -0.7)])
    assert tg.gradgradcheck(lambda t: Cube.apply(t, 0.5), [f64(0.3, -0.7)])


def test_custom_function_outputs_and_needs_input_grad():
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b):
            seen["needs"] = ctx.needs_input_grad
            return a * b

        @staticmethod
        def backward(ctx, g):
            return g, None

    Probe.apply(f64(1.0), f64(2.0, requires_grad=False))
    assert seen["needs"] == (True, False)
    x = f64(1.5, -0.5, 2.0)
    pos, neg, count = SplitSigns.apply(x)
    assert not count.requires_grad and int(count.item()) == 2
    (pos * 2 + neg * 3).sum().backward()
    assert_close(x.grad.detach().numpy(), [2.0, 3.0, 2.0])


def test_custom_function_contract_and_versions():
    class WrongShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.sum()

    with pytest.raises(RuntimeError, match=r"WrongShape.backward returned a gradient of shape"):
        WrongShape.apply(f64(1.0, 2.0)).sum().backward()

    x = f64(1.0, 2.0)
    y = Cube.apply(x * 1, 1.0)
    z = x * 1
    y2 = Cube.apply(z, 1.0)
    with tg.no_grad():
        z += 1.0
    with pytest.raises(RuntimeError, match="modified in place"):
        y2.sum().backward()
    y.sum().backward()
    with pytest.raises(TypeError, match="NotTensor.forward returned float"):

        class NotTensor(Function):
            @staticmethod
            def forward(ctx, x):
                return 3.0

        NotTensor.apply(x)


# ----------------------------------------------------------------------------- hooks


def test_tensor_hooks_replace_the_gradient_and_remove():
    x = f64(1.0, 2.0)
    h = x * 3
    seen = []
    handle = h.register_hook(lambda g: seen.append(g.detach().numpy().copy()) or g * 10)
    leaf = x.register_hook(lambda g: g + 1)  # before accumulation into .grad
    (h * h).sum().backward()
    assert_close(seen[0], 2 * h.detach().numpy())
    assert_close(x.grad.detach().numpy(), 3 * 10 * 2 * h.detach().numpy() + 1)
    handle.remove()
    leaf.remove()
    x.grad = None
    (x * 3 * x).sum().backward()
    assert_close(x.grad.detach().numpy(), 6 * x.detach().numpy())


def test_retain_grad_keeps_a_non_leaf_gradient():
    x = f64(1.0, 2.0)
    h = x * x
    h.retain_grad()
    (h * 3).sum().backward()
    assert_close(h.grad.detach().numpy(), [3.0, 3.0])


def test_module_forward_hooks():
    lin = nn.Linear(3, 2)
    x = tg.randn(4, 3)
    got = {}
    h1 = lin.register_forward_hook(lambda m, args, out: got.setdefault("out", out))
    h2 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    out = lin(x)
    assert got["out"] is out
    assert_close(
        out.detach().numpy(), np.broadcast_to(lin.bias.detach().numpy(), (4, 2))
    )  # inputs zeroed
    h3 = lin.register_forward_hook(lambda m, args, out: out * 0 + 7)
    assert_close(lin(x).detach().numpy(), np.full((4, 2), 7.0))
    for h in (h1, h2, h3):
        h.remove()
    assert_close(lin(x).detach().numpy(), (x @ lin.weight.T + lin.bias).detach().numpy())


# ----------------------------------------------------------------------------- PyTorch's numbers
TORCH = "torch is not installed: pip install -e '.[hf]' (or pip install torch==2.13.0)"


def test_second_derivatives_match_torch_on_gpt_ops():
    torch = pytest.importorskip("torch", reason=TORCH)
    r = np.random.default_rng(0)
    xs = [r.standard_normal((2, 3, 4)), r.standard_normal(4), r.standard_normal((4, 5))]
    t = np.array([1, 0, 4, 2, 3, 3])

    def loss(lib, Fn, x, w, W):
        h = Fn.layer_norm(x, (4,), w, None)
        h = Fn.gelu(h, approximate="tanh") @ W
        a = Fn.scaled_dot_product_attention(h, h, h, is_causal=True)
        return Fn.cross_entropy(a.reshape(6, 5), lib.tensor(t))

    ours = [tg.tensor(a, dtype=tg.float64, requires_grad=True) for a in xs]
    theirs = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in xs]
    g1 = grad(loss(tg, F, *ours), ours, create_graph=True)
    penalty = sum((g * g).sum() for g in g1)
    g2 = grad(penalty, ours)
    tg1 = torch.autograd.grad(loss(torch, torch.nn.functional, *theirs), theirs, create_graph=True)
    tg2 = torch.autograd.grad(sum((g * g).sum() for g in tg1), theirs)
    for a, b in zip(g1 + g2, tg1 + tg2):
        assert_close(a.detach().numpy(), b.detach().numpy(), atol=1e-12, rtol=1e-7)


def test_grad_walks_only_the_paths_to_its_inputs():
    x, w = f64(1.0, 2.0), f64(3.0)
    a = (x * x).sum()
    b = (w.exp() * 2).sum()
    loss = a + b
    b.backward(retain_graph=False)  # frees the w branch only
    (gx,) = grad(loss, x)  # never visits the freed branch
    assert_close(gx.detach().numpy(), 2 * x.detach().numpy())


def test_functional_matches_torch():
    torch = pytest.importorskip("torch", reason=TORCH)
    r = np.random.default_rng(3)
    a, v = r.standard_normal((3, 4)), r.standard_normal((3, 4))
    emb = r.standard_normal((5, 4))

    def make(lib, Fn):
        E = lib.tensor(emb)
        ids = lib.tensor(np.array([0, 3, 3]))

        def f(x):  # scalar: log_softmax of (x + embedded rows), softmax-weighted
            h = x + Fn.embedding(ids, E)
            return (Fn.log_softmax(h, dim=-1) * Fn.softmax(h * 2, dim=-1)).sum()

        return f

    ours, theirs = make(tg, F), make(torch, torch.nn.functional)
    x, xt = tg.tensor(a, dtype=tg.float64), torch.tensor(a)
    vv, vt = tg.tensor(v, dtype=tg.float64), torch.tensor(v)
    TF = torch.autograd.functional
    pairs = [
        (functional.hessian(ours, x), TF.hessian(theirs, xt)),
        (functional.hvp(ours, x, vv)[1], TF.hvp(theirs, xt, vt)[1]),
        (
            functional.jacobian(lambda t: F.softmax(t, dim=0), x),
            TF.jacobian(lambda t: torch.softmax(t, dim=0), xt),
        ),
        (
            functional.jvp(lambda t: F.softmax(t, dim=0), x, vv)[1],
            TF.jvp(lambda t: torch.softmax(t, dim=0), xt, vt)[1],
        ),
        (
            functional.vjp(lambda t: F.softmax(t, dim=0), x, vv)[1],
            TF.vjp(lambda t: torch.softmax(t, dim=0), xt, vt)[1],
        ),
    ]
    for i, (got, want) in enumerate(pairs):
        assert_close(
            got.detach().numpy(), want.detach().numpy(), atol=1e-12, rtol=1e-7, what=f"pair {i}"
        )


def test_custom_function_saving_its_output_differentiates_twice():
    class MyExp(Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors  # the output: depends on x in the recorded backward
            return g * y

    x = f64(0.5, -1.0)
    (g,) = grad(MyExp.apply(x).sum(), x, create_graph=True)
    (h,) = grad(g.sum(), x)
    assert_close(h.detach().numpy(), np.exp(x.detach().numpy()))
