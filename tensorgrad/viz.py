"""Graphviz export of a recorded graph: ``tg.viz.to_dot(loss, params=model)``.

Walks the Op nodes reachable from a tensor (iteratively, through ``.edges``) and writes
one DOT node per op (name, output shape, dtype) and per leaf tensor (its parameter name when
``params`` names it, else ``input (shape)``), with edges in the direction data flows.

Collapsing repeated blocks. A parameter belongs to block i when its dotted name has a numeric
segment (``transformer.h.3.attn.c_attn.weight`` -> 3, the first such segment). Every op gets a
stage, propagated from its inputs in one topological pass:

- an op's stage is the largest stage among its inputs, where a block-i parameter counts as i;
- an op that consumes a parameter outside every block (ln_f, the tied wte at the head) while
  its other inputs already come out of a block is *after* the blocks, and so is everything
  downstream of it; the same parameter consumed with no block upstream (the embedding
  lookups) leaves the op *before* the blocks.

Unless ``expand=True``, all ops of block i and block i's parameters fold into one node
``block i``; ops before and after the blocks stay expanded. Graphs without numbered
parameters are never collapsed.

Imports: pathlib, re, shutil, subprocess, .autograd, .tensor.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from .autograd import Op
from .tensor import Tensor

GRAPHVIZ_HINT = "install graphviz: apt-get install graphviz / brew install graphviz"
_FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf"}
_BLOCK_NUM = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
_BEFORE, _AFTER = -1, 1 << 30  # stages outside the numbered blocks


def _param_names(params) -> dict[int, str]:
    """id(tensor) -> name, from a Module (named_parameters) or a dict name -> tensor."""
    if params is None:
        return {}
    items = params.named_parameters() if hasattr(params, "named_parameters") else params.items()
    return {id(p): name for name, p in items}


def _block_of(name: str | None) -> int | None:
    m = _BLOCK_NUM.search(name or "")
    return int(m.group(1)) if m else None


def _shape(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _walk(root: Op):
    """Every node reachable from ``root`` and every leaf tensor, in input-before-output order."""
    order, leaves, expanded = [], {}, set()
    stack = [(root, False)]
    while stack:  # iterative post-order DFS: deep graphs never hit the recursion limit
        fn, done = stack.pop()
        if done:
            order.append(fn)
            continue
        if id(fn) in expanded:
            continue
        expanded.add(id(fn))
        stack.append((fn, True))
        for e in fn.edges:
            if type(e) is tuple:
                if id(e[0]) not in expanded:
                    stack.append((e[0], False))
            elif isinstance(e, Tensor):
                leaves[id(e)] = e
    return order, leaves


def _stages(order, names) -> dict[int, int]:
    """id(node) -> stage (block index, _BEFORE or _AFTER), by the rule in the module docstring."""
    stage: dict[int, int] = {}
    for fn in order:  # inputs come first in ``order``
        from_ops = [stage[id(e[0])] for e in fn.edges if type(e) is tuple]
        named = [names[id(e)] for e in fn.edges if isinstance(e, Tensor) and id(e) in names]
        blocks = [b for b in map(_block_of, named) if b is not None]
        s = max(from_ops + blocks, default=_BEFORE)
        if s > _BEFORE and len(blocks) < len(named):  # a parameter of no block, after a block
            s = _AFTER
        stage[id(fn)] = s
    return stage


def _op_label(fn: Op) -> str:
    shapes = [f"{_shape(s)} {dt}" for s, dt in fn.out_meta]
    return fn.name + "\n" + "\n".join(shapes)


def to_dot(tensor: Tensor, params=None, expand: bool = False, path=None) -> str:
    """Graphviz DOT text of the graph that produced ``tensor``.

    params: a Module or a dict name -> Parameter, to label leaves by name and to find blocks.
    expand: draw every op of every block instead of one node per block.
    path: also write the graph: ``.dot`` writes the text; ``.svg``/``.png``/``.pdf`` write the
    text next to it (``path.with_suffix('.dot')``) and render it with Graphviz's ``dot``,
    raising RuntimeError when ``dot`` is not installed.
    """
    names = _param_names(params)
    lines = [
        "digraph tensorgrad {",
        '  rankdir=TB; node [shape=box, fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=8];',
    ]
    root = tensor.grad_fn
    if root is None:  # a leaf: the graph is the tensor itself
        label = names.get(id(tensor), "input") + f"\n{_shape(tensor.shape)} {tensor.dtype.name}"
        lines.append(f"  t0 [label={_quote(label)}, shape=ellipse];")
        return _finish(lines, path)

    order, leaves = _walk(root)
    stage = _stages(order, names)
    collapse = not expand
    node_id, blocks = {}, {}  # id(op or leaf) -> DOT id; block index -> [ops, params]
    for k, fn in enumerate(order):
        s = stage[id(fn)]
        if collapse and _BEFORE < s < _AFTER:
            node_id[id(fn)] = f"block{s}"
            blocks.setdefault(s, [0, set(), fn])[0] += 1
            blocks[s][2] = fn  # the last op of the block in input-before-output order
        else:
            node_id[id(fn)] = f"op{k}"
            style = ", style=filled, fillcolor=lightyellow" if fn is root else ""
            lines.append(f"  op{k} [label={_quote(_op_label(fn))}{style}];")
    for k, (key, t) in enumerate(leaves.items()):
        name = names.get(key)
        b = _block_of(name)
        if collapse and b is not None and b in blocks:
            node_id[key] = f"block{b}"
            blocks[b][1].add(key)
            continue
        node_id[key] = f"leaf{k}"
        label = (name or "input") + f"\n{_shape(t.shape)} {t.dtype.name}"
        fill = "lightblue" if name else "lightgrey"
        lines.append(
            f"  leaf{k} [label={_quote(label)}, shape=ellipse, style=filled, fillcolor={fill}];"
        )
    for b, (n_ops, n_params, last) in sorted(blocks.items()):
        out = ", ".join(f"{_shape(s)} {dt}" for s, dt in last.out_meta)
        label = f"block {b}\n{n_ops} ops, {len(n_params)} parameters\nout {out}"
        lines.append(
            f"  block{b} [label={_quote(label)}, shape=box3d, style=filled, fillcolor=honeydew];"
        )

    edges = set()
    for fn in order:
        dst = node_id[id(fn)]
        for e in fn.edges:
            if e is None:
                continue
            if type(e) is tuple:
                src, out = node_id[id(e[0])], e[1] if e[0].n_out > 1 else None
            else:
                src, out = node_id[id(e)], None
            if src != dst and (src, dst, out) not in edges:
                edges.add((src, dst, out))
                attr = f" [label={_quote(f'out {out}')}]" if out is not None else ""
                lines.append(f"  {src} -> {dst}{attr};")
    return _finish(lines, path)


def _finish(lines, path) -> str:
    lines.append("}")
    dot = "\n".join(lines) + "\n"
    if path is not None:
        render(dot, path)
    return dot


def render(dot: str, path) -> Path:
    """Write ``dot`` to ``path`` (.dot) or render it to .svg/.png/.pdf with Graphviz."""
    path = Path(path)
    if path.suffix == ".dot":
        path.write_text(dot)
        return path
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"to_dot: cannot render {path.name}; use .dot, .svg, .png or .pdf")
    dot_path = path.with_suffix(".dot")
    dot_path.write_text(dot)
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError(
            f"rendering {path} needs Graphviz's `dot` program, which is not on PATH "
            f"(the DOT text is in {dot_path}); {GRAPHVIZ_HINT}"
        )
    res = subprocess.run(
        [exe, f"-T{fmt}", str(dot_path), "-o", str(path)], capture_output=True, text=True
    )
    if res.returncode != 0:
        raise RuntimeError(f"dot failed on {dot_path}: {res.stderr.strip()}")
    return path
