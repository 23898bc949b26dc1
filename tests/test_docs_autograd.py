"""docs/autograd.md's Python examples run as written and print what their comments say
(the conventions of test_readme.py: the comment's text up to ': ' starts the printed line)."""

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "autograd.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def claims(code: str) -> list[str]:
    return [
        m.group(1).strip()
        for line in code.splitlines()
        if line.lstrip().startswith("print(") and (m := re.search(r"\)\s+#\s*(.*)$", line))
    ]


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_autograd_doc_example_runs(code, capsys):
    exec(compile(code, str(PAGE), "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out.strip().splitlines()
    said = claims(code)
    assert said and len(out) >= len(said), f"{len(said)} commented prints, {len(out)} lines"
    for claim, line in zip(said, out):
        assert line.startswith(claim.split(": ")[0]), f"docs say {claim!r}, printed {line!r}"
