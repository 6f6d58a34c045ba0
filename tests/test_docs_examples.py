"""Every ```python block of README.md and docs/*.md runs, each in its own subprocess from a folder
outside the repository, except a block whose preceding line (blank lines aside) is
`<!-- example: not run -->`. So the documentation's examples are self-contained and current."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_RUN = "<!-- example: not run -->"
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*(\S*)")


def python_blocks(path: Path):
    """[(line number of the opening fence, code, runs)] of the file's python blocks."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
            body.append(lines[i])
            i += 1
        i += 1
        if lang not in ("python", "py", "python3"):
            continue
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        runs = not (j >= 0 and lines[j].strip() == NOT_RUN)
        blocks.append((start + 1, textwrap.dedent("\n".join(body)), runs))
    return blocks


def _documents():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def _cases():
    cases = []
    for doc in _documents():
        for line, code, runs in python_blocks(doc):
            marks = () if runs else (pytest.mark.skip(reason=f"marked {NOT_RUN} in the docs"),)
            cases.append(pytest.param(code, id=f"{doc.relative_to(ROOT)}:{line}", marks=marks))
    return cases


def test_the_block_finder(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("text\n```python\nprint(1)\n```\n\n" + NOT_RUN + "\n\n```python\nx = q\n```\n"
                   "```bash\necho\n```\n  ```py\n  print(2)\n  ```\n")
    assert python_blocks(doc) == [(2, "print(1)", True), (8, "x = q", False), (14, "print(2)", True)]


def test_the_readme_has_a_runnable_example():
    assert any(runs for _, _, runs in python_blocks(ROOT / "README.md")), "README.md has no runnable python block"


@pytest.mark.parametrize("code", _cases())
def test_example_runs(code, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=900)
    assert res.returncode == 0, f"the example failed:\n{code}\n--- stdout\n{res.stdout[-2000:]}\n--- stderr\n" \
                                f"{res.stderr[-3000:]}"
