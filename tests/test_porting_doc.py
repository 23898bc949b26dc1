"""docs/porting-scripts.md: its Python examples run and print what their comments say (each
commented print's claim is the start of an output line, in order)."""

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "porting-scripts.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def claims(code: str) -> list[str]:
    return [
        m.group(1).strip()
        for line in code.splitlines()
        if line.lstrip().startswith("print(") and (m := re.search(r"\)\s+#\s*(.*)$", line))
    ]


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_porting_doc_example_runs(code, capsys):
    exec(compile(code, str(DOC), "exec"), {"__name__": "__doc__"})
    out = iter(capsys.readouterr().out.strip().splitlines())
    said = claims(code)
    assert said
    for claim in said:
        assert any(line.startswith(claim) for line in out), f"no output line starts {claim!r}"
