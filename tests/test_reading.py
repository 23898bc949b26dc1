"""docs/reading.md, tensorgrad's core in reading order, checked against the code: each file's
line counts as the table gives them, the core within its budget, the plain backward path
within one screen, and every other module of tensorgrad named on the page as surface.

Lines of code are counted as tinygrad counts its own: lines holding code, so no blank lines,
comments or docstrings. The table gives all lines too.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reading.md"
BUDGET = 3000  # lines of code in the core: read in an afternoon
SCREEN = 80  # lines of code on the plain backward path: one screen
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
_SKIP |= {tokenize.ENDMARKER, tokenize.ENCODING}


def _docstrings(tree) -> set[int]:
    """The line numbers of every module, class and function docstring."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def code_lines(src: str, span: tuple[int, int] | None = None) -> int:
    """Lines of ``src`` (within ``span``, first and last line) that hold code."""
    doc, lines = _docstrings(ast.parse(src)), set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in _SKIP:
            lines.update(n for n in range(tok.start[0], tok.end[0] + 1) if n not in doc)
    if span is not None:
        lines = {n for n in lines if span[0] <= n <= span[1]}
    return len(lines)


def core_table() -> list[tuple[str, int, int]]:
    """(file, lines of code, lines) for each row of the page's core table."""
    rows = re.findall(r"^\| *\d+ *\| *`(tensorgrad/[\w/]+\.py)` *\| *([\d,]+) *\| *([\d,]+) *\|",
                      PAGE.read_text("utf-8"), re.M)  # fmt: skip
    return [(f, int(a.replace(",", "")), int(b.replace(",", ""))) for f, a, b in rows]


def plain_path() -> list[tuple[str, str]]:
    """(file, function) for each function the page lists on the plain backward path."""
    text = PAGE.read_text("utf-8")
    section = text.split("## The plain backward path", 1)[1].split("\n## ", 1)[0]
    found = []
    for path, names in re.findall(
        r"^- `(tensorgrad/[\w/]+\.py)`: (.+?)(?:\n\n|\n- |\Z)", section, re.M | re.S
    ):
        found += [(path, n) for n in re.findall(r"`(\w+)`", names)]
    return found


def test_the_page_gives_each_core_file_its_true_line_counts():
    rows = core_table()
    assert len(rows) >= 10, "docs/reading.md's core table is missing or its rows do not parse"
    wrong = []
    for path, code, lines in rows:
        src = (ROOT / path).read_text("utf-8")
        got = (code_lines(src), len(src.splitlines()))
        if got != (code, lines):
            wrong.append(
                f"{path}: the page says {code} code / {lines} lines; it has {got[0]} / {got[1]}"
            )
    assert not wrong, "docs/reading.md's counts are stale:\n" + "\n".join(wrong)


def test_the_core_is_within_its_budget():
    total = sum(code for _, code, _ in core_table())
    assert total <= BUDGET, f"the core holds {total} lines of code, over its budget of {BUDGET}"
    assert f"{total:,}" in PAGE.read_text("utf-8"), f"the page should state the total, {total:,}"


def test_the_plain_backward_path_fits_one_screen():
    listed = plain_path()
    assert len(listed) >= 3, "docs/reading.md lists no plain backward path"
    total = 0
    for path, name in listed:
        src = (ROOT / path).read_text("utf-8")
        spans = [
            (n.lineno, n.end_lineno)
            for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name
        ]
        assert spans, f"docs/reading.md names {path}: {name}, which does not exist"
        total += code_lines(src, spans[0])
    assert total <= SCREEN, (
        f"the plain backward path is {total} lines of code (one screen: {SCREEN})"
    )


def test_every_module_is_on_the_page():
    """Each module is in the core table or named on the page as surface: nothing is hidden."""
    text = PAGE.read_text("utf-8")
    missing = [
        str(p.relative_to(ROOT))
        for p in sorted((ROOT / "tensorgrad").rglob("*.py"))
        if f"`{p.relative_to(ROOT)}`" not in text
    ]
    assert not missing, "docs/reading.md does not name: " + ", ".join(missing)


def test_the_counter_counts_code_only():
    src = '"""Doc."""\n\n# a comment\nx = 1  # why\n\n\ndef f():\n    """Doc\n    more."""\n    return (\n        x\n    )\n'
    assert code_lines(src) == 5  # x = 1, def, return (, x, )
    assert code_lines(src, (7, 12)) == 4


def imported(tree: ast.Module) -> set[str]:
    """What a module imports at its top level (a ``try`` block's imports too): a package's
    top-level name (numpy, sys), or a relative module as written (.graph, ..devices)."""
    names = set()
    nodes = [n for n in tree.body if not isinstance(n, ast.Try)]
    nodes += [n for t in tree.body if isinstance(t, ast.Try) for n in t.body]
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            dots = "." * node.level
            if node.module:
                names.add(dots + node.module.split(".")[0] if dots else node.module.split(".")[0])
            else:
                names.update(dots + a.name for a in node.names)
    return names


def test_every_module_says_what_it_holds_and_what_it_imports():
    """Each module's docstring ends with an ``Imports:`` line naming exactly what it imports."""
    wrong = []
    for path in sorted((ROOT / "tensorgrad").rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        doc = ast.get_docstring(tree) or ""
        said = re.search(r"^Imports: (.*)\Z", doc.strip(), re.M | re.S)
        if not doc or said is None:
            wrong.append(f"{path.relative_to(ROOT)}: no docstring with an Imports: line")
            continue
        listed = {n.strip() for n in said.group(1).rstrip(".").split(",")} - {"nothing"}
        if listed != imported(tree):
            wrong.append(
                f"{path.relative_to(ROOT)}: says {sorted(listed)}, imports {sorted(imported(tree))}"
            )
    assert not wrong, "\n".join(wrong)
