"""Random draws beyond randn/rand, as PyTorch's: ``Generator`` (a generator of one's own) and
``default_generator``, ``manual_seed`` (which returns it), ``randint``, ``randperm`` and
``multinomial``.

Imports: numpy, .devices, .tensor.
"""

from __future__ import annotations

import numpy as np

from . import devices
from .devices import parse_device, rng, xp_for
from .tensor import Tensor


def _shape(size):
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def _new(arr, requires_grad):
    return Tensor(arr, requires_grad=requires_grad)  # wraps the array: no copy, its own dtype


class Generator:
    """A random generator of its own, as torch.Generator: ``tg.Generator().manual_seed(42)``
    passed as ``generator=`` draws independently of the global seed. ``tg.manual_seed``
    returns the global one (it follows every later ``tg.manual_seed``)."""

    def __init__(self, device="cpu", _default: bool = False):
        self.device = parse_device(device)
        self._default = _default
        self._seed = devices.generators.seed if _default else 67280421310721
        self._gens = {}

    def manual_seed(self, seed: int) -> Generator:
        if self._default:
            devices.manual_seed(seed)
        self._seed, self._gens = int(seed), {}
        return self

    def initial_seed(self) -> int:
        return self._seed

    def seed(self) -> int:
        return self.manual_seed(int(np.random.SeedSequence().entropy % 2**63))._seed

    def rng(self, device: str = "cpu"):
        """The backend generator for ``device`` (NumPy's, or CuPy's on the GPU)."""
        if self._default:
            return rng(device)
        device = parse_device(device)
        if device not in self._gens:
            if device == "cpu":
                self._gens[device] = np.random.Generator(np.random.PCG64(self._seed))
            else:
                xp = xp_for(device)
                self._gens[device] = xp.random.Generator(xp.random.XORWOW(self._seed))
        return self._gens[device]

    def get_state(self) -> dict:
        return (
            devices.get_rng_state()
            if self._default
            else {"seed": self._seed, "cpu": self.rng("cpu").bit_generator.state}
        )

    def set_state(self, state: dict) -> None:
        if self._default:
            devices.set_rng_state(state)
        else:
            self.manual_seed(state["seed"])
            self._gens["cpu"].bit_generator.state = state["cpu"]


default_generator = Generator(_default=True)


def manual_seed(seed: int) -> Generator:
    """Seed every device's generator, so that a run repeats exactly; returns the generator."""
    return default_generator.manual_seed(seed)


def _gen(generator, device):
    return (generator or default_generator).rng(device)


def randint(
    *args, size=None, dtype=None, device=None, generator=None, requires_grad=False
) -> Tensor:
    """Integers in [low, high): ``randint(low, high, size)`` or ``randint(high, size)``."""
    args = list(args)
    if size is None:
        if not args or not isinstance(args[-1], (tuple, list)):
            raise TypeError("randint: expected randint(low, high, size) or randint(high, size)")
        size = args.pop()
    if len(args) == 1:
        low, high = 0, args[0]
    elif len(args) == 2:
        low, high = args
    else:
        raise TypeError("randint: expected randint(low, high, size) or randint(high, size)")
    if high <= low:
        raise RuntimeError(f"randint: expected low < high, got low={low}, high={high}")
    g = _gen(generator, parse_device(device))
    arr = g.integers(int(low), int(high), size=_shape((size,)), dtype=np.dtype(dtype or np.int64))
    return _new(arr, requires_grad)


def randperm(n: int, dtype=None, device=None, generator=None) -> Tensor:
    g = _gen(generator, parse_device(device))
    return _new(g.permutation(int(n)).astype(dtype or np.int64), False)


def multinomial(probs, num_samples: int, replacement: bool = False, generator=None) -> Tensor:
    """Class ids drawn with the given (unnormalised, non-negative) weights, per row of a 1-d or
    2-d ``probs``: (num_samples,) or (rows, num_samples) int64, as torch.multinomial.

    With replacement it inverts the cumulative distribution; without, it takes the top
    ``num_samples`` of log(p) + Gumbel noise (each draw then excludes the ones before it).
    Categories of weight 0 are never drawn."""
    p = probs if isinstance(probs, Tensor) else Tensor(probs)
    if p.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: probs must be 1-d or 2-d, got {p.ndim} dims")
    xp = xp_for(p.device)
    w = p.array.reshape(1, -1) if p.ndim == 1 else p.array
    w = w.astype(np.float64)
    n = w.shape[1]
    if not bool(xp.isfinite(w).all()) or bool((w < 0).any()):
        raise RuntimeError(
            "multinomial: probability tensor contains either inf, nan or element < 0"
        )
    nonzero = (w > 0).sum(axis=1)
    if bool((nonzero == 0).any()):
        raise RuntimeError(
            "multinomial: invalid multinomial distribution (sum of probabilities <= 0)"
        )
    if not replacement and (num_samples > n or bool((nonzero < num_samples).any())):
        raise RuntimeError(
            f"multinomial: cannot sample {num_samples} > {int(nonzero.min())} "
            "categories of nonzero weight without replacement"
        )
    g = _gen(generator, p.device)
    u = g.random((w.shape[0], num_samples))
    if replacement:
        cdf = xp.cumsum(w, axis=1)
        cdf /= cdf[:, -1:]
        # category j is drawn when cdf[j-1] <= u < cdf[j]: count the cdf values <= u
        idx = (cdf[:, None, :] <= u[:, :, None]).sum(axis=2)
        idx = xp.minimum(idx, n - 1)
    else:
        gumbel = -xp.log(-xp.log(g.random(w.shape)))
        with devices.errstate(xp, divide="ignore"):
            keys = xp.where(w > 0, xp.log(xp.where(w > 0, w, 1)) + gumbel, -xp.inf)
        idx = xp.argsort(-keys, axis=1, kind="stable")[:, :num_samples]
    idx = idx.astype(np.int64)
    return _new(idx.reshape(-1) if p.ndim == 1 else idx, False)
