"""tensorgrad.utils.data against PyTorch's documented behaviour: batch shapes and order,
drop_last, samplers (with and without replacement, their statistics), collate of nested
samples, random_split, reproducibility from manual_seed or a Generator (issue 29)."""

from collections import Counter, namedtuple

import numpy as np
import pytest

import tensorgrad as tg
from tensorgrad.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    default_convert,
    random_split,
)
from tensorgrad.utils.data.dataloader import DataLoader as DataLoaderByPath


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, float(i * i)


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def ints(t):
    return t.numpy().tolist()


def test_module_paths_and_torch_names():
    assert DataLoaderByPath is DataLoader
    assert tg.utils.data.RandomSampler is RandomSampler


@pytest.mark.parametrize(
    "n, bs, drop_last", [(10, 4, False), (10, 4, True), (8, 4, True), (3, 5, False)]
)
def test_sequential_batches_shapes_order_and_len(n, bs, drop_last):
    loader = DataLoader(Squares(n), batch_size=bs, drop_last=drop_last)
    batches = list(loader)
    want = [list(range(i, min(i + bs, n))) for i in range(0, n, bs)]
    if drop_last:
        want = [b for b in want if len(b) == bs]
    assert len(loader) == len(want) == len(batches)
    for (i, sq), w in zip(batches, want):
        assert ints(i) == w and i.dtype == np.int64
        assert sq.dtype == np.float64 and sq.numpy().tolist() == [float(k * k) for k in w]


def test_tensor_dataset_batches_stack_rows():
    x, y = tg.randn(10, 3), tg.arange(10)
    ds = TensorDataset(x, y)
    assert len(ds) == 10 and ints(ds[2][1]) == 2
    xb, yb = next(iter(DataLoader(ds, batch_size=4)))
    assert xb.shape == (4, 3) and xb.dtype == np.float32
    np.testing.assert_array_equal(xb.numpy(), x.numpy()[:4])
    assert ints(yb) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="size mismatch"):
        TensorDataset(tg.zeros(3), tg.zeros(4))


def test_shuffle_is_a_permutation_each_epoch_and_repeats_with_manual_seed():
    loader = DataLoader(TensorDataset(tg.arange(20)), batch_size=6, shuffle=True)
    tg.manual_seed(3)
    e1 = [v for (b,) in loader for v in ints(b)]
    e2 = [v for (b,) in loader for v in ints(b)]
    assert sorted(e1) == sorted(e2) == list(range(20)) and e1 != e2
    tg.manual_seed(3)
    assert [v for (b,) in loader for v in ints(b)] == e1


def test_generator_gives_an_independent_repeatable_order():
    ds = TensorDataset(tg.arange(30))

    def order(seed):
        g = tg.Generator().manual_seed(seed)
        return [
            v for (b,) in DataLoader(ds, batch_size=7, shuffle=True, generator=g) for v in ints(b)
        ]

    tg.manual_seed(0)
    a = order(5)
    tg.manual_seed(1)  # the global seed does not matter with a generator
    assert order(5) == a and order(6) != a


def test_random_sampler_without_replacement_covers_each_index_once_per_epoch():
    s = list(RandomSampler(range(7), num_samples=17))
    assert len(s) == 17
    assert sorted(s[:7]) == sorted(s[7:14]) == list(range(7)) and len(set(s[14:])) == 3


def test_random_sampler_with_replacement_statistics_and_lazy_huge_num_samples():
    n, k = 5, 20000
    counts = Counter(RandomSampler(range(n), replacement=True, num_samples=k))
    assert set(counts) == set(range(n))
    expected = k / n
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 18.5  # chi-square, 4 degrees of freedom: p = 0.001
    huge = RandomSampler(range(n), replacement=True, num_samples=int(1e10))  # minGPT's Trainer
    it = iter(huge)
    assert len(huge) == 10**10 and all(0 <= next(it) < n for _ in range(3000))


def test_random_sampler_argument_errors():
    with pytest.raises(ValueError, match="num_samples"):
        RandomSampler(range(3), num_samples=0)
    with pytest.raises(TypeError, match="replacement"):
        RandomSampler(range(3), replacement=1)


def test_batch_sampler_and_len():
    assert list(BatchSampler(SequentialSampler(range(10)), 3, drop_last=False)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [9],
    ]
    assert list(BatchSampler(range(10), 3, drop_last=True))[-1] == [6, 7, 8]
    assert (
        len(BatchSampler(range(10), 3, False)) == 4 and len(BatchSampler(range(10), 3, True)) == 3
    )
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(range(3), 0, False)


def test_loader_with_sampler_and_with_batch_sampler():
    ds = TensorDataset(tg.arange(10))
    out = [ints(b) for (b,) in DataLoader(ds, batch_size=2, sampler=[9, 8, 7, 0])]
    assert out == [[9, 8], [7, 0]]
    out = [ints(b) for (b,) in DataLoader(ds, batch_sampler=[[1, 2, 3], [5]])]
    assert out == [[1, 2, 3], [5]]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampler=[0], shuffle=True), "mutually exclusive with shuffle"),
        (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
        (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
        (dict(batch_size=None, drop_last=True), "mutually exclusive with drop_last"),
        (dict(num_workers=-1), "num_workers"),
    ],
)
def test_loader_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DataLoader(Squares(4), **kwargs)


def test_iterable_dataset_batches_in_stream_order():
    assert [ints(b) for b in DataLoader(Stream(7), batch_size=3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [ints(b) for b in DataLoader(Stream(7), batch_size=3, drop_last=True)] == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(Stream(3), shuffle=True)


def test_batch_size_none_converts_without_batching():
    ds = [np.arange(3), np.arange(3) + 1]
    out = list(DataLoader(ds, batch_size=None))
    assert len(out) == 2 and isinstance(out[0], tg.Tensor) and ints(out[1]) == [1, 2, 3]
    assert default_convert({"a": (np.float32(2.0), "s")})["a"][1] == "s"


def test_default_collate_nested_structures():
    Point = namedtuple("Point", "x y")
    batch = [
        {"img": np.ones((2, 2), np.float32) * i, "label": i, "meta": (Point(i, 0.5), "n")}
        for i in range(3)
    ]
    out = default_collate(batch)
    assert out["img"].shape == (3, 2, 2) and out["img"].dtype == np.float32
    assert ints(out["label"]) == [0, 1, 2] and out["label"].dtype == np.int64
    meta = out["meta"]
    # the outer tuple becomes a list; the strings stay the tuple zip made, as in PyTorch
    assert isinstance(meta, list) and meta[1] == ("n", "n", "n")
    assert isinstance(meta[0], Point) and ints(meta[0].x) == [0, 1, 2]
    assert meta[0].y.dtype == np.float64
    assert default_collate([np.int16(1), np.int16(2)]).dtype == np.int16
    assert default_collate([True, False]).dtype == np.bool_
    assert default_collate([[1, 2], [3, 4]])[0].numpy().tolist() == [1, 3]


def test_default_collate_errors():
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([tg.zeros(2), tg.zeros(3)])
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [3]])
    with pytest.raises(TypeError, match="found object"):
        default_collate([object(), object()])


def test_collate_fn_and_num_workers_and_pin_memory_are_accepted():
    seen = []
    loader = DataLoader(
        Squares(5),
        batch_size=2,
        num_workers=4,
        pin_memory=True,
        collate_fn=lambda b: [i for i, _ in b],
        worker_init_fn=seen.append,
    )
    assert list(loader) == [[0, 1], [2, 3], [4]] and seen == [0]


def test_random_split_lengths_fractions_and_generator():
    a, b = random_split(range(10), [3, 7], generator=tg.Generator().manual_seed(1))
    assert isinstance(a, Subset) and len(a) == 3 and len(b) == 7
    assert sorted(list(a) + list(b)) == list(range(10))
    c, d = random_split(range(10), [3, 7], generator=tg.Generator().manual_seed(1))
    assert list(c) == list(a)
    parts = random_split(range(11), [0.5, 0.3, 0.2])
    assert [len(p) for p in parts] == [6, 3, 2]  # floor 5, 3, 2; the remainder to the first
    with pytest.raises(ValueError, match="does not equal the length"):
        random_split(range(10), [3, 3])


def test_concat_subset_and_other_samplers():
    cat = Squares(3) + Squares(2)
    assert (
        isinstance(cat, ConcatDataset) and len(cat) == 5 and cat[3] == (0, 0.0) and cat[-1][0] == 1
    )
    assert sorted(SubsetRandomSampler([4, 7, 9])) == [4, 7, 9]
    w = Counter(WeightedRandomSampler([0.0, 1.0, 3.0], 4000))
    assert w[0] == 0 and 2.5 < w[2] / w[1] < 3.6
