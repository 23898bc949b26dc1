"""The reference ops: one ``Function`` each, plain array math through ``xp``, grouped by kind.

    elementwise.py  arithmetic with broadcasting, unary math, where / masked_fill, casts
    reduce.py       sum, mean, var, max over dims
    shape.py        reshape, permute, expand, indexing, cat / stack / split
    linalg.py       matmul and linear
    nn.py           softmax, log_softmax, cross_entropy, layer_norm, gelu, dropout,
                    embedding, attention
    dims.py         PyTorch's dimension rules, shared by all of them

Faster implementations live in ``tensorgrad/kernels/`` and ``tensorgrad/cuda/``,
registered against these ops' ``op`` names.
"""
