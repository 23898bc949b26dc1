"""The reference ops: one ``Op`` each, plain array math through ``xp``, grouped by kind.

    elementwise.py  arithmetic with broadcasting, unary math, where / masked_fill, casts
    reduce.py       sum, mean, var, max over dims
    shape.py        reshape, permute, expand, indexing, cat / stack / split
    linalg.py       matmul and linear
    nn.py           softmax, log_softmax, cross_entropy, layer_norm, gelu, dropout,
                    embedding, attention
    special.py      erf (NumPy has none), for the exact GELU
    dims.py         PyTorch's dimension rules, shared by all of them
    tensor_xp.py    NumPy's functions on Tensors, each a recorded op: what ``xp`` is when a
                    backward runs under create_graph=True (so every backward is differentiable)

Faster implementations live in ``tensorgrad/kernels/`` and ``tensorgrad/cuda/``,
registered against these ops' ``op`` names.
"""
