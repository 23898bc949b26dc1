"""The README's self-contained Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
          if b.startswith("import")]


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, capsys):
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip()
