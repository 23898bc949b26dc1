"""The README's self-contained Python examples run as written and print what they say.

A block that starts with ``import`` is run. Each ``print(...)`` line with a trailing comment
states its output: the comment's text up to the first ': ' is the start of the printed line,
except that a comment with ``~N`` numbers (``# falls from ~0.69 to ~0.2``) means the line's
last number is within 50% of the last of them. The prints are matched to the output lines
in order.
"""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = [
    b
    for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    if b.startswith("import")
]
NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"


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
        assert got, f"README says {claim!r}, printed {line!r}"
        want, value = float(approx[-1]), float(got[-1])
        assert abs(value - want) <= 0.5 * abs(want), f"README says {claim!r}, printed {line!r}"
    else:
        want = claim.split(": ")[0]
        assert line.startswith(want), f"README says {want!r}, printed {line!r}"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code, capsys):
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out.strip().splitlines()
    assert out
    said = claims(code)
    assert len(out) >= len(said), f"{len(said)} commented prints, {len(out)} output lines"
    for claim, line in zip(said, out):
        check(claim, line)


def test_every_block_with_prints_states_their_output():
    assert all(claims(b) for b in BLOCKS if "print(" in b)
