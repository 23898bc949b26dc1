"""The README's and docs/*.md's self-contained Python examples run as written and print what
they say; the README's reading path points at the code it names; CI installs what the README
says.

A block that starts with ``import`` is run. Each ``print(...)`` line with a trailing comment
states its output: the comment's text up to the first ': ' is the start of the printed line,
except that a comment with ``~N`` numbers (``# falls from ~0.69 to ~0.2``) means the line's
last number is within 50% of the last of them. The prints are matched to the output lines
in order.
"""

import ast
import re
from pathlib import Path

import pytest

import tensorgrad as tg

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# pages whose blocks need a fixture and run in their own test (tests/test_hf_export.py: an
# export and transformers in place of the hub)
OWN_RUNNER = {"huggingface.md"}
BLOCKS = [
    (page, b)
    for page in PAGES
    if page.name not in OWN_RUNNER
    for b in re.findall(r"```python\n(.*?)```", page.read_text("utf-8"), re.S)
    if b.startswith("import")
]
NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
# a reading-path row: | stage | what | [file:a-b](file#La-Lb) | `code` |
PATH_ROW = re.compile(
    r"^\|[^|]*\|[^|]*\| \[([\w/.]+):(\d+)-(\d+)\]\(([\w/.]+)#L(\d+)-L(\d+)\) \| `(.+)` \|$"
)


def claims(code: str) -> list[str]:
    """The trailing comment of each line that prints."""
    return [
        m.group(1).strip()
        for line in code.splitlines()
        if line.lstrip().startswith("print(") and (m := re.search(r"\)\s+#\s*(.*)$", line))
    ]


def check(claim: str, line: str) -> None:
    approx = re.findall(r"~(" + NUMBER + ")", claim)
    if approx:
        got = re.findall(NUMBER, line)
        assert got, f"the docs say {claim!r}, printed {line!r}"
        want, value = float(approx[-1]), float(got[-1])
        assert abs(value - want) <= 0.5 * abs(want), f"the docs say {claim!r}, printed {line!r}"
    else:
        want = claim.split(": ")[0]
        assert line.startswith(want), f"the docs say {want!r}, printed {line!r}"


def block_id(i: int) -> str:
    page, code = BLOCKS[i]
    n = sum(1 for p, _ in BLOCKS[:i] if p == page)
    return f"{page.relative_to(ROOT)}:{n}"


@pytest.mark.parametrize("i", range(len(BLOCKS)), ids=block_id)
def test_doc_example_runs(i, capsys, monkeypatch):
    page, code = BLOCKS[i]
    # an example may switch kernels on or off (docs/internals.md does): not for later tests,
    # which under TG_KERNELS=0 must still run the reference ops
    monkeypatch.setattr(tg.kernels, "_enabled", tg.kernels.is_enabled())
    monkeypatch.setattr(tg.kernels, "_disabled", set(tg.kernels._disabled))
    exec(compile(code, str(page), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out.strip().splitlines()
    assert out
    said = claims(code)
    assert len(out) >= len(said), f"{len(said)} commented prints, {len(out)} output lines"
    for claim, line in zip(said, out):
        check(claim, line)


def test_every_block_with_prints_states_their_output():
    assert all(claims(b) for _, b in BLOCKS if "print(" in b)


def test_the_readme_is_a_front_door():
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 250
    for page in re.findall(r"\]\((docs/[\w.-]+)\)", text):
        assert (ROOT / page).exists(), f"README links to {page}, which does not exist"


def reading_path() -> list[tuple]:
    rows = [PATH_ROW.match(line) for line in README.read_text("utf-8").splitlines()]
    return [m.groups() for m in rows if m]


def test_the_reading_path_points_at_the_code_it_names():
    rows = reading_path()
    assert len(rows) >= 15, "the README's reading path is missing or its rows do not parse"
    stages = " ".join(line for line in README.read_text("utf-8").splitlines() if line[:2] == "| ")
    for stage in ("token ids", "embeddings", "Q, K, V", "heads", "mask", "softmax",
                  "output projection", "residual", "LayerNorm", "MLP", "logits",
                  "cross-entropy", "W_Q, W_K, W_V", "AdamW"):  # fmt: skip
        assert stage in stages, f"the reading path has no {stage!r} stage"
    for file, a, b, link, la, lb, code in rows:
        assert (file, a, b) == (link, la, lb), f"{file}:{a}-{b} links to {link}#L{la}-L{lb}"
        path = ROOT / file
        assert path.is_file(), f"the reading path names {file}, which does not exist"
        lines = path.read_text("utf-8").splitlines()
        a, b = int(a), int(b)
        if code not in "\n".join(lines[a - 1 : b]):
            where = [n + 1 for n, line in enumerate(lines) if code.split("\n")[0] in line]
            pytest.fail(f"README: {file}:{a}-{b} should hold `{code}`; it is at lines {where}")
        if code.startswith("def "):  # a function: the range is the whole of it, no more
            fn = next(
                n for n in ast.walk(ast.parse("\n".join(lines)))
                if isinstance(n, ast.FunctionDef) and n.name == code[4:]
            )  # fmt: skip
            want = (fn.lineno, fn.end_lineno)
            assert (a, b) == want, f"README: {file}:{a}-{b} should be {want[0]}-{want[1]}"


def test_ci_installs_and_tests_what_the_readme_says():
    ci = (ROOT / ".ci" / "run").read_text()
    text = README.read_text("utf-8")
    install = re.search(r"^(pip install [^#\n]*?)\s*(#.*)?$", text, re.M).group(1)
    assert install in ci, f"the README installs with {install!r}; .ci/run does not"
    assert "python -m pytest" in text and "\npython -m pytest\n" in ci


def test_prompts_for_a_shakespeare_run_occur_in_its_corpus():
    """A prompt shown for the default run is text the corpus holds (it writes 'Romeo.', not
    'ROMEO:'). Needs the corpus in the cache; skips without it (no download here)."""
    from gpt.data import SHAKESPEARE_FILE, default_cache_dir, read_shakespeare

    if not (default_cache_dir() / SHAKESPEARE_FILE).exists():
        pytest.skip(
            "the Shakespeare corpus is not in the cache: run gpt-train once, or python -c "
            "'from gpt.data import read_shakespeare; read_shakespeare()', to download it"
        )
    text = "\n".join(body for _, body in read_shakespeare())
    prompts = [
        p
        for page in PAGES
        for line in page.read_text("utf-8").splitlines()
        if line.startswith(("gpt-sample", "gpt-explain")) and "--init-from" not in line
        for p in re.findall(r'--prompt "([^"]+)"', line)
        if p not in ("...", "The capital of France is Paris")  # a fresh model's own prompt
    ]
    assert prompts, "no example prompts found"
    for p in prompts:
        assert p in text, f"the example prompt {p!r} never occurs in the corpus"


def test_the_quickstart_install_draws_the_loss_plot():
    """The README shows loss.png right under the quickstart: its install must bring matplotlib
    (a default dependency, or an extra the install command names)."""
    tomllib = pytest.importorskip(
        "tomllib", reason="tomllib is in the standard library from Python 3.11"
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    install = re.search(r'^pip install -e "\.\[([\w,]+)\]"', README.read_text("utf-8"), re.M)
    extras = install.group(1).split(",") if install else []
    deps = project["dependencies"] + [
        d for e in extras for d in project["optional-dependencies"].get(e, [])
    ]
    assert any(d.startswith("matplotlib") for d in deps), "the quickstart install lacks matplotlib"
