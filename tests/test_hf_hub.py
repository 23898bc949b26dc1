"""From the hub: GPT.from_pretrained("gpt2") and --init-from gpt2 through huggingface_hub's cache.

The tests build that cache on disk, in the layout huggingface_hub reads offline
(models--owner--name/refs/<branch or tag>, snapshots/<commit>/<file> -> ../../blobs/<hash>),
holding small GPT-2s made here, and run with HF_HUB_OFFLINE=1; nothing needs the network
except the test marked `network`, which skips without it.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_hf_export import IDS, assert_same_weights, logits, tiny_gpt
from test_train import corpus  # noqa: F401  (a fixture)

from gpt import GPT, explain, hub, sample, train
from gpt.hub import HubError, resolve
from gpt.store import validate as val
from gpt.store.errors import CheckpointError
from gpt.tokenizer import BPETokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the king and queen of a far land rode out at dawn to see what lay beyond\n" * 30


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty hub cache that huggingface_hub (and subprocesses) use, offline."""
    pytest.importorskip(
        "huggingface_hub", reason="huggingface_hub is not installed: pip install -e '.[hf]'"
    )
    from huggingface_hub import constants

    root = tmp_path / "hub"
    root.mkdir()
    for k, v in {"HF_HUB_CACHE": str(root), "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    # huggingface_hub read the environment when it was imported
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return root


def publish(cache: Path, repo: str, files: dict, ref: str = "main", commit: str | None = None):
    """Put files (name -> bytes) into the cache as repo's snapshot at ref; returns the commit."""
    blobs = b"".join(hashlib.sha256(data).digest() for data in files.values())
    commit = commit or hashlib.sha1(blobs + ref.encode()).hexdigest()
    folder = cache / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return commit


def exported(tmp_path, model, tok=None) -> dict:
    """The files save_pretrained writes, as name -> bytes (what a hub repo holds)."""
    d = tmp_path / f"export-{id(model)}"
    model.save_pretrained(d, tok)
    files = {p.name: p.read_bytes() for p in d.iterdir()}
    if tok is not None:  # a real GPT-2 repo also has a tokenizers-format file: ignored
        files["tokenizer.json"] = json.dumps({"model": {"type": "BPE"}}).encode()
    return files


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(TEXT, 270)


@pytest.fixture
def gpt2(cache, tmp_path, bpe):
    """'gpt2' in the cache: a small GPT-2 with a BPE tokenizer."""
    model = tiny_gpt(seed=3, vocab_size=270)
    publish(cache, "gpt2", exported(tmp_path, model, bpe))
    return model


def one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg, msg
    return msg


# ----------------------------------------------------------------------------- resolving
def test_from_pretrained_gpt2_reads_the_offline_hub_cache(gpt2, cache):
    d = resolve("gpt2")
    assert d.parent == cache / "models--gpt2" / "snapshots"
    assert_same_weights(gpt2, GPT.from_pretrained("gpt2"))


def test_owner_repo_branches_tags_and_commits(cache, tmp_path):
    a, b = tiny_gpt(seed=1), tiny_gpt(seed=2)
    commit_a = publish(cache, "someone/tiny-gpt2", exported(tmp_path, a))
    publish(cache, "someone/tiny-gpt2", exported(tmp_path, b), ref="v1")
    assert_same_weights(a, GPT.from_pretrained("someone/tiny-gpt2"))
    assert_same_weights(b, GPT.from_pretrained("someone/tiny-gpt2", revision="v1"))
    assert_same_weights(b, GPT.from_pretrained("someone/tiny-gpt2@v1"))
    assert_same_weights(a, GPT.from_pretrained("someone/tiny-gpt2", revision=commit_a))


def test_a_local_directory_wins_over_a_hub_name(gpt2, tmp_path, monkeypatch):
    other = tiny_gpt(seed=9, vocab_size=270)
    other.save_pretrained(tmp_path / "gpt2")
    monkeypatch.chdir(tmp_path)
    assert resolve("gpt2") == Path("gpt2")
    assert_same_weights(other, GPT.from_pretrained("gpt2"))
    with pytest.raises(HubError, match="applies to hub names; gpt2 is a local directory"):
        resolve("gpt2", revision="main")


def test_hub_names_parse():
    assert hub.parse_hub_name("gpt2-xl") == ("gpt2-xl", None)
    assert hub.parse_hub_name("openai-community/gpt2@v1.0") == ("openai-community/gpt2", "v1.0")
    for bad in ("gpt2/", "./gpt2", "/abs/gpt2", "a/b/c", "a--b", "x@", "sp ace", "~/m", "a..b"):
        assert hub.parse_hub_name(bad) is None, bad


# ----------------------------------------------------------------------------- refusals
def _pickle_only(cache, tmp_path):
    files = exported(tmp_path, tiny_gpt())
    files["pytorch_model.bin"] = files.pop("model.safetensors")  # the bytes do not matter
    publish(cache, "someone/pickled", files)
    return "someone/pickled"


def _sharded(cache, tmp_path):
    files = exported(tmp_path, tiny_gpt())
    files["model-00001-of-00001.safetensors"] = files.pop("model.safetensors")
    files["model.safetensors.index.json"] = b"{}"
    publish(cache, "someone/sharded", files)
    return "someone/sharded"


def _tampered(cache, tmp_path):
    files = exported(tmp_path, tiny_gpt())
    data = files["model.safetensors"]
    n = int.from_bytes(data[:8], "little")
    header = data[8 : 8 + n].replace(b"[16,64]", b"[64,16]")  # c_fc: claims another shape
    assert header != data[8 : 8 + n]
    files["model.safetensors"] = data[:8] + header + data[8 + n :]
    publish(cache, "someone/tampered", files)
    return "someone/tampered"


def _config_only(cache, tmp_path):
    publish(
        cache, "someone/partial", {"config.json": exported(tmp_path, tiny_gpt())["config.json"]}
    )
    return "someone/partial"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda c, t: "not a/hub name", "is neither a directory nor a Hugging Face hub name"),
        (
            lambda c, t: "nobody/nothing",
            "nobody/nothing is not a local directory nor in the Hugging Face cache",
        ),
        (
            lambda c, t: "gpt2@no-such-branch",
            "gpt2@no-such-branch is not a local directory nor in the",
        ),
        (_pickle_only, "has only a pickle checkpoint (pytorch_model.bin); gpt never loads"),
        (_sharded, "stores its weights in several safetensors shards"),
        (_tampered, "does not fit the model config: transformer.h.0.mlp.c_fc.weight has shape"),
        (_config_only, "model.safetensors is not in the Hugging Face cache"),
    ],
    ids=["bad-name", "no-repo", "no-revision", "pickle-only", "sharded", "tampered", "partial"],
)
def test_each_refusal_is_one_clear_line(gpt2, cache, tmp_path, make, message):
    name = make(cache, tmp_path)
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained(name)
    assert message in one_line(e)


@pytest.mark.parametrize(
    ("listing", "message"),
    [
        (["config.json", "pytorch_model.bin"], "has only a pickle checkpoint (pytorch_model.bin)"),
        (["config.json", "README.md"], "someone/bare has no model.safetensors"),
        (["README.md"], "has no config.json: it is not a transformers model repo"),
    ],
)
def test_the_hub_listing_refuses_before_the_weights_are_fetched(
    cache, tmp_path, monkeypatch, listing, message
):
    """Online, the first step fetches config.json alone and the hub lists the repo's files."""
    import huggingface_hub

    publish(cache, "someone/bare", {"config.json": exported(tmp_path, tiny_gpt())["config.json"]})
    files = [type("RepoFile", (), {"path": name}) for name in listing]
    monkeypatch.setattr(huggingface_hub, "get_cached_repo_tree", lambda *a, **k: files)
    with pytest.raises(HubError) as e:
        resolve("someone/bare")
    assert message in one_line(e)


def test_memory_is_estimated_from_the_config_before_the_weights(gpt2, monkeypatch):
    monkeypatch.setattr(val, "available_memory", lambda: 1000)
    with pytest.raises(CheckpointError) as e:
        resolve("gpt2")
    assert "the GPT-2 gpt2 (" in one_line(e) and "needs about" in one_line(e)


def test_without_huggingface_hub_one_line_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    with pytest.raises(HubError) as e:
        GPT.from_pretrained("gpt2")
    assert one_line(e) == (
        "gpt2 is not a local directory, and fetching it from the Hugging Face hub needs "
        "huggingface_hub: pip install -e '.[hf]'"
    )


# ----------------------------------------------------------------------------- the commands
def test_gpt_sample_init_from_a_hub_name_honours_the_environment(gpt2, cache, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # HF_HUB_CACHE / HF_HUB_OFFLINE from the fixture
    cmd = [sys.executable, "-m", "gpt.sample", "--init-from", "gpt2", "--prompt", "the king"]
    cmd += ["--max-new-tokens", "4", "--temperature", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("the king") and "sampling from gpt2" in p.stderr
    p = subprocess.run(
        [*cmd[:4], "nobody/nothing", *cmd[5:]], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert p.stderr.startswith("gpt-sample: error: nobody/nothing is not a local directory nor in")


def test_gpt_sample_refuses_a_name_that_is_neither(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert sample.main(["--init-from", "gpt2/"]) == 2
    assert "--init-from gpt2/ is neither a directory nor a Hugging Face hub name" in (
        capsys.readouterr().err
    )


def test_gpt_explain_init_from_a_hub_name(gpt2, tmp_path):
    out = tmp_path / "explain.txt"
    assert explain.main(["--init-from", "gpt2", "--prompt", "the king", "-o", str(out)]) == 0
    assert "GPT-2 checkpoint gpt2" in out.read_text()


def test_gpt_train_fine_tunes_a_hub_name(gpt2, corpus, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    args = ["--data", str(corpus), "--out-dir", str(out), "--init-from", "gpt2", "--no-sample"]
    args += ["--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1", "--batch-size", "2"]
    assert train.main(args) == 0
    ckpt = json.loads((out / "ckpt.json").read_text())
    assert ckpt["train_config"]["init_from"] == "gpt2"  # the name, not a cache path
    assert ckpt["model_config"]["vocab_size"] == 270 and ckpt["tokenizer"]["type"] == "bpe"


# ----------------------------------------------------------------------------- transformers
def test_from_pretrained_equals_transformers_from_the_same_cache(gpt2, cache):
    hf = "is not installed: pip install -e '.[hf]'"
    torch = pytest.importorskip("torch", reason=f"torch {hf}")
    transformers = pytest.importorskip("transformers", reason=f"transformers {hf}")
    hf = transformers.GPT2LMHeadModel.from_pretrained(
        "gpt2", cache_dir=str(cache), local_files_only=True
    ).eval()
    ours = GPT.from_pretrained("gpt2")
    ids = IDS % 270
    with torch.no_grad():
        theirs = hf(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(logits(ours, ids), theirs, rtol=0, atol=1e-4)
    for name, p in hf.named_parameters():
        w = p.detach().numpy()
        mine = dict(ours.named_parameters())[name].array
        assert np.array_equal(np.asarray(mine), w.T if w.ndim == 2 and "c_" in name else w), name


@pytest.mark.network
def test_real_gpt2_from_the_hub():
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError:
        pytest.skip("huggingface.co is not reachable: run where the network reaches it")
    pytest.importorskip(
        "huggingface_hub", reason="huggingface_hub is not installed: pip install -e '.[hf]'"
    )
    model = GPT.from_pretrained("gpt2")  # ~550 MB into the default hub cache, once
    assert model.config.n_layer == 12 and model.config.vocab_size == 50257
    assert (resolve("gpt2") / "vocab.json").is_file()


# ----------------------------------------------------------------------------- token shards
def test_shards_take_gpt2s_tokenizer_from_the_hub_without_its_weights(cache, tmp_path, bpe):
    """Token shards need GPT-2's vocab.json + merges.txt only: tokenizer_dir fetches those two
    (here from the offline cache, where the weights are not), and a repo without them is one
    line."""
    from test_shards import shard_dir

    from gpt.shards import shard_tokenizer

    d = tmp_path / "tok"
    bpe.save(d)
    publish(cache, "gpt2", {f: (d / f).read_bytes() for f in hub.TOKENIZER_FILES})
    got = hub.tokenizer_dir("gpt2")
    assert sorted(p.name for p in got.iterdir()) == sorted(hub.TOKENIZER_FILES)
    with pytest.raises(HubError, match="no model.safetensors|not in the Hugging Face cache"):
        resolve("gpt2")  # the weights are not there: the full fetch would need them
    data = shard_dir(tmp_path / "shards", "npy")
    for f in hub.TOKENIZER_FILES:
        (data / f).unlink(missing_ok=True)
    assert shard_tokenizer(data).encode("the king rode") == bpe.encode("the king rode")
    publish(cache, "owner/empty", {"README.md": b"no tokenizer"})
    with pytest.raises(HubError) as e:
        hub.tokenizer_dir("owner/empty")
    assert one_line(e) == "owner/empty has no GPT-2 tokenizer (vocab.json and merges.txt)"
