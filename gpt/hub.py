"""GPT-2 checkpoints by name: a local directory, or a Hugging Face hub repo fetched into its cache.

`resolve(name_or_path)` answers with a local directory holding config.json, model.safetensors
and the tokenizer files. A directory that exists is used as it is; anything else that reads
as a hub name (``gpt2``, ``gpt2-xl``, ``owner/repo``, optionally ``@revision``) is fetched with
huggingface_hub (the ``hf`` extra) into its standard cache, so HF_HOME, HF_HUB_CACHE and
HF_HUB_OFFLINE work as they do for transformers, and a second call reads the cache.

Only safetensors are fetched (`HUB_FILES`); a repo whose weights are a pickle is refused. The
config is fetched first and checked (schema, the memory the model needs) before the weights
are downloaded; the weights' header is then checked by `GPT.from_pretrained` like any local
directory's (gpt.checkpoint.check_hf_dir). Every failure is one `HubError` line.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from .store.checkpoint import hf_config, read_json
from .store.errors import CheckpointError
from .store.validate import check_memory, estimate_bytes, gib

HUB_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer.json")
TOKENIZER_FILES = ("vocab.json", "merges.txt")  # what tokenizer_dir fetches
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
INSTALL = "pip install -e '.[hf]'"
# one part of a repo id, as the hub allows them: letters, digits, '-', '_', '.'
_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")


class HubError(CheckpointError):
    """A name that is neither a usable local directory nor a usable hub repo (one line)."""


def parse_hub_name(s: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) when s reads as ``name``, ``owner/name`` or ``...@revision``;
    None otherwise (an absolute or ./ path, a trailing slash, characters the hub refuses)."""
    name, at, rev = s.partition("@")
    parts = name.split("/")
    if len(parts) > 2 or (at and not rev.strip()):
        return None
    if not all(_PART.fullmatch(p) and "--" not in p and ".." not in p for p in parts):
        return None
    return name, rev or None


def _path_kind(s: str) -> str:
    """'dir', 'other' or 'none' for the path s; a name the filesystem refuses (too long, a
    file as a parent) is 'none', so that it meets the hub's checks, not an OSError."""
    if not s:  # Path('') is '.': an empty name is no name, not the current directory
        return "none"
    try:
        p = Path(s).expanduser()
        return "dir" if p.is_dir() else "other" if p.exists() else "none"
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return "none"


def _shown(s: str) -> str:
    if not s:
        return "the empty name ''"
    return s if len(s) <= 80 else f"{s[:60]}... ({len(s)} characters)"


def is_hub_name(s: str) -> bool:
    """s names a hub repo: it reads as one and no file or directory of that name exists."""
    return _path_kind(s) == "none" and parse_hub_name(s) is not None


def source_problem(s: str) -> str | None:
    """Why ``--init-from s`` cannot work, without touching the network: None when s is a
    directory or reads as a hub name, else one line."""
    kind = _path_kind(s)
    if kind == "dir":
        return None
    if kind == "other":
        return f"{_shown(s)} is not a directory"
    if parse_hub_name(s) is None:
        return (
            f"{_shown(s)} is neither a directory nor a Hugging Face hub name "
            "(gpt2, gpt2-medium, gpt2-large, gpt2-xl, owner/repo[@revision])"
        )
    return None


def resolve(name_or_path, revision: str | None = None) -> Path:
    """The local directory of a GPT-2 checkpoint: name_or_path itself when it is a directory,
    else the hub repo it names, at ``revision`` (a branch, tag or commit; default main),
    fetched into the hub cache (config.json, model.safetensors and the tokenizer files)."""
    s = os.fspath(name_or_path)
    if _path_kind(s) == "dir":
        if revision is not None:
            raise HubError(f"revision={revision!r} applies to hub names; {s} is a local directory")
        return Path(s).expanduser()
    problem = source_problem(s)
    if problem is not None:
        raise HubError(problem)
    repo, rev = parse_hub_name(s)
    if revision is not None and rev is not None and revision != rev:
        raise HubError(f"{s} names revision {rev!r} but revision={revision!r} was passed")
    return _fetch(repo, revision or rev)


def _import_hub(where: str):
    try:
        import huggingface_hub
    except ImportError:
        raise HubError(
            f"{where} is not a local directory, and fetching it from the Hugging Face hub "
            f"needs huggingface_hub: {INSTALL}"
        ) from None
    return huggingface_hub


def _fetch(repo: str, revision: str | None) -> Path:
    """snapshot_download in two steps: config.json (checked, memory estimated), then the rest."""
    where = repo + (f"@{revision}" if revision else "")
    hub = _import_hub(where)
    from huggingface_hub import constants

    offline = bool(constants.HF_HUB_OFFLINE)
    with _hub_errors(where, repo, revision):
        snap = Path(hub.snapshot_download(repo, revision=revision, allow_patterns=["config.json"]))
        names, complete = _listing(hub, repo, snap, offline)
        _check_names(where, names, complete, constants.HF_HUB_CACHE)
        config = hf_config(read_json(snap / "config.json", 1 << 20), f"{where}: config.json")
        need = estimate_bytes(config, train=False)
        check_memory(need, f"the GPT-2 {where} ({gib(need // 12)} of weights)")
        # the commit found above, so that both steps read the same snapshot; from the cache
        # alone when the hub was not reached above (offline, or the network is down)
        snap = Path(
            hub.snapshot_download(
                repo,
                revision=snap.name,
                allow_patterns=list(HUB_FILES),
                local_files_only=not complete,
            )
        )
    if not (snap / "model.safetensors").is_file():  # the listing did not know it was missing
        raise HubError(f"{where} has no model.safetensors in the Hugging Face cache ({snap})")
    return snap


def tokenizer_dir(repo: str = "gpt2", revision: str | None = None) -> Path:
    """The local directory of a hub repo's GPT-2 tokenizer (vocab.json and merges.txt) alone,
    fetched into the hub cache without the weights (token shards need only the tokenizer)."""
    where = repo + (f"@{revision}" if revision else "")
    hub = _import_hub(where)
    with _hub_errors(where, repo, revision):
        snap = Path(
            hub.snapshot_download(repo, revision=revision, allow_patterns=list(TOKENIZER_FILES))
        )
    if not all((snap / f).is_file() for f in TOKENIZER_FILES):
        raise HubError(f"{where} has no GPT-2 tokenizer (vocab.json and merges.txt)")
    return snap


@contextlib.contextmanager
def _hub_errors(where: str, repo: str, revision: str | None):
    """huggingface_hub's failures as one HubError line each."""
    from huggingface_hub import constants, errors

    try:
        yield
    except errors.GatedRepoError:
        raise HubError(
            f"{where} is gated on the Hugging Face hub: accept its terms on huggingface.co "
            "and log in (hf auth login)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise HubError(
            f"{repo} is not a local directory, and the Hugging Face hub has no model {repo!r} "
            "(a private one needs hf auth login)"
        ) from None
    except errors.RevisionNotFoundError:
        raise HubError(f"the Hugging Face hub repo {repo!r} has no revision {revision!r}") from None
    except errors.LocalEntryNotFoundError:
        cache = constants.HF_HUB_CACHE
        if constants.HF_HUB_OFFLINE:
            raise HubError(
                f"{where} is not a local directory nor in the Hugging Face cache ({cache}), and "
                "HF_HUB_OFFLINE is set: check the name and revision, or fetch it once online"
            ) from None
        raise HubError(
            f"cannot reach the Hugging Face hub to fetch {where}, and it is not in the cache "
            f"({cache})"
        ) from None
    except errors.HFValidationError as e:
        raise HubError(f"{where!r} is not a valid hub name: {_first_line(e)}") from None
    except (errors.HfHubHTTPError, OSError) as e:
        raise HubError(
            f"cannot fetch {where} from the Hugging Face hub: {_first_line(e)}"
        ) from None


def _listing(hub, repo: str, snap: Path, offline: bool) -> tuple[set[str], bool]:
    """(file names of the repo at the snapshot's commit, whether that list is complete):
    the listing the hub cache keeps, or the hub's own; without either, the cached files."""
    cached = {p.name for p in snap.iterdir()} if snap.is_dir() else set()  # nothing matched
    tree = getattr(hub, "get_cached_repo_tree", None)
    if tree is not None:  # huggingface_hub >= 2 keeps the listing whenever it reached the hub
        try:
            return {f.path for f in tree(repo, revision=snap.name)}, True
        except hub.errors.CachedRepoTreeNotFoundError:  # (imported by _fetch)
            return cached, False
    if not offline:
        try:
            return set(hub.list_repo_files(repo, revision=snap.name)), True
        except Exception:  # noqa: BLE001 (unreachable, timed out, ...: the cache is all we know)
            pass
    return cached, False


def _check_names(where: str, names: set[str], complete: bool, cache: str) -> None:
    """Refuse a repo without a single model.safetensors (before anything large is fetched)."""
    if {"config.json", "model.safetensors"} <= names:
        return
    if complete and "config.json" not in names:
        raise HubError(f"{where} has no config.json: it is not a transformers model repo")
    if "model.safetensors.index.json" in names:
        raise HubError(
            f"{where} stores its weights in several safetensors shards; gpt loads a single "
            "model.safetensors"
        )
    pickles = sorted(n for n in names if n.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise HubError(
            f"{where} has only a pickle checkpoint ({pickles[0]}); gpt never loads pickles "
            "(loading one can run code): use a repo with model.safetensors"
        )
    if complete:
        raise HubError(f"{where} has no model.safetensors")
    missing = "config.json" if "config.json" not in names else "model.safetensors"
    raise HubError(
        f"{where}: {missing} is not in the Hugging Face cache ({cache}) and the hub cannot "
        "be asked (HF_HUB_OFFLINE is set, or the network is down); fetch it once online"
    )


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
