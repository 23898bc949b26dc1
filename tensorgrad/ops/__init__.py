"""The reference ops: one ``Op`` each, its formula and its backward in plain array math
through ``xp`` (NumPy or CuPy). A reading guide, core first.

The ops the GPT and the core Tensor methods use:

    nn.py           softmax, log_softmax, cross_entropy, layer_norm, gelu, dropout,
                    embedding, attention: start here
    linalg.py       matmul and linear
    elementwise.py  + - * / **, exp, log, sqrt, tanh, abs, relu, sigmoid, where,
                    masked_fill, casts
    reduce.py       sum, mean, max over dims
    shape.py        reshape, permute, expand, indexing, cat / stack / split, clone
    dims.py         PyTorch's dimension rules, shared by all of them
    special.py      erf (NumPy has none), for the exact GELU (approximate='none')

The rest, for PyTorch code beyond the GPT:

    more_math.py    sin, cos, log2, sign / floor / round, clamp, maximum / minimum,
                    var, cumsum, prod, einsum
    more_shape.py   flip, roll, gather, scatter_add, pad, and the ops of an in-place
                    write through a view
    dtypes.py       PyTorch's type promotion for mixed dtypes
    tensor_xp.py    NumPy's functions on Tensors, each a recorded op: what ``xp`` is when a
                    backward runs under create_graph=True (so every backward is differentiable)

Faster implementations live in ``tensorgrad/kernels/`` and ``tensorgrad/cuda/``,
registered against these ops' ``op`` names.

Imports: nothing.
"""
