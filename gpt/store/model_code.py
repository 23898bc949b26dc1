"""Which code a model's weights belong to: a digest of the model's source, kept in checkpoints.

``model_code(model)`` is the record a checkpoint (ckpt.json's ``model_code``) and an export
(config.json's ``tensorgrad_model_code``) carry::

    {"class": "gpt.model.GPT",                   the model's class path
     "digest": "<sha256>",                        of the parts below, sorted
     "parts": {"gpt.model": "<sha256, 16 hex>",   the source of the class's module, whole
               "gpt.model.MLP": "...",            each class of the model's module tree
               "tensorgrad.nn.layers.Linear": "...", ...}}

A class's part hashes the source of every function it defines (methods, properties,
static and class methods), each read from the function itself: an edit of the file changes
the module's part and the class's, and a method replaced at run time (``MLP.forward = f``)
changes the class's part. The framework's base ``Module`` (parameters, hooks, state_dict) is
not part of the model's code; the functions and kernels the layers call (``F.*``, the ops)
are the framework's, not the model's, and are not covered either.

Why the source and not the traced ops: the source is read without running the model (no
forward of a 1.5B-parameter model to load it), is the same on every device, with or without
tensorgrad.compile, fused attention or a kernel cache, and sees a changed constant (an
attention scale of 0.5 is the same ``mul`` op as 1/√hs). Its cost is that an edit of a comment
counts as a change; the message names what changed, so the reader can judge.

``code_change(recorded, model)`` says in one line how ``model``'s code differs from a record,
or returns None: the same code, or nothing recorded (a checkpoint from before the record).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys

KEY = "model_code"  # in ckpt.json
HF_KEY = "tensorgrad_model_code"  # in an export's config.json
_SOURCES: dict = {}  # code object or module name -> sha256 of its source, read once a process


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _function_sha(fn) -> str:
    code = getattr(fn, "__code__", None)
    key = code if code is not None else fn
    if key not in _SOURCES:
        try:
            _SOURCES[key] = _sha(inspect.getsource(fn))
        except (OSError, TypeError):  # no source file (a builtin, code typed in a REPL)
            what = (code.co_code, code.co_consts, code.co_names) if code else fn.__qualname__
            _SOURCES[key] = _sha(repr(what))
    return _SOURCES[key]


def _functions(cls):
    """(name, function) of what ``cls`` itself defines, properties and wrappers unwrapped."""
    for name, v in sorted(vars(cls).items()):
        if isinstance(v, (staticmethod, classmethod)):
            v = v.__func__
        if isinstance(v, property):
            for part, f in (("get", v.fget), ("set", v.fset), ("del", v.fdel)):
                if f is not None:
                    yield f"{name}.{part}", f
        elif inspect.isfunction(v):
            yield name, v


def _class_sha(cls) -> str:
    return _sha(json.dumps([(n, _function_sha(f)) for n, f in _functions(cls)]))


def _module_sha(name: str) -> str | None:
    if name not in _SOURCES:
        try:
            _SOURCES[name] = _sha(inspect.getsource(sys.modules[name]))
        except (OSError, TypeError, KeyError):
            _SOURCES[name] = None
    return _SOURCES[name]


def class_path(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _classes(model) -> set:
    """The classes of the model's module tree and their bases, less Module and object."""
    from tensorgrad.nn import Module

    out = set()
    for m in model.modules():
        out.update(c for c in type(m).__mro__ if c not in (Module, object))
    return out


def model_code(model) -> dict | None:
    """The record of ``model``'s code (see the module docstring); None when its module's
    source cannot be read (an installation without .py files)."""
    cls = type(model)
    module = _module_sha(cls.__module__)
    if module is None:
        return None
    parts = {cls.__module__: module[:16]}
    for c in _classes(model):
        parts[class_path(c)] = _class_sha(c)[:16]
    parts = dict(sorted(parts.items()))
    return {"class": class_path(cls), "digest": _sha(json.dumps(parts)), "parts": parts}


def valid(record) -> bool:
    """A record as model_code writes it (checked before it is trusted or compared)."""
    return (
        isinstance(record, dict)
        and isinstance(record.get("class"), str)
        and isinstance(record.get("digest"), str)
        and isinstance(record.get("parts", {}), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in record["parts"].items())
    )


def _names(names: list[str], most: int = 3) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def code_change(recorded, model) -> str | None:
    """How ``model``'s code differs from ``recorded`` (a model_code record), as a clause
    ('gpt.model.MLP changed'); None when they agree or when nothing (valid) was recorded."""
    return compare(recorded, model_code(model)) if valid(recorded) else None


def compare(recorded, now: dict | None) -> str | None:
    """code_change for two records: ``now`` the code running (None: its source is unknown)."""
    if not valid(recorded):
        return None
    if now is None:
        return "this code's source cannot be read, so it cannot be compared"
    said = []
    if recorded["class"] != now["class"]:
        said.append(f"saved from {recorded['class']}, loaded into {now['class']}")
    if recorded["digest"] != now["digest"]:
        old, new = recorded.get("parts") or {}, now["parts"]
        changed = [k for k in new if k in old and old[k] != new[k]]
        added = [k for k in new if k not in old]
        gone = [k for k in old if k not in new]
        if changed:
            said.append(f"{_names(changed)} changed")
        if added and recorded["class"] == now["class"]:
            said.append(f"{_names(added)} {'is' if len(added) == 1 else 'are'} new")
        if gone and recorded["class"] == now["class"]:
            said.append(f"{_names(gone)} {'is' if len(gone) == 1 else 'are'} gone")
        if not said:
            said.append(f"digest {recorded['digest'][:12]} is now {now['digest'][:12]}")
    return "; ".join(said) or None


def say_code_change(recorded, model, what: str, prefix: str = "note") -> str | None:
    """Print one line on stderr when ``model``'s code is not the one ``recorded`` (what: the
    checkpoint, e.g. 'the checkpoint in out/run'); returns the line, or None."""
    change = code_change(recorded, model)
    if change is None:
        return None
    line = (
        f"{prefix}: {what} was trained with other model code than this one ({change}); its "
        "weights load, but this code may compute something else"
    )
    print(line, file=sys.stderr)
    return line
