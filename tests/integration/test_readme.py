"""README.md is executed and rendered: its Python blocks run, its test command is the one CI
runs, and a real Markdown parser (markdown-it-py, CommonMark) finds every fence closed."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from markdown_it import MarkdownIt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def fence_problems(text: str) -> list[str]:
    """Fenced code blocks that are never closed, as CommonMark renders ``text``.

    An unclosed fence runs to the end of the document, so everything after it renders as code;
    an unbalanced set of fences always ends in one.
    """
    lines = text.splitlines()
    problems = []
    for token in MarkdownIt("commonmark").parse(text):
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map
        last = lines[end - 1].strip() if end - start >= 2 else ""
        closer = re.escape(token.markup[0]) + "{%d,}" % len(token.markup)
        if not re.fullmatch(closer, last):
            problems.append(
                f"the {token.markup} fence opened on line {start + 1} is never closed: it runs to the "
                f"end of the document (line {len(lines)}) and turns everything after it into code"
            )
    return problems


def unrendered_headings(text: str) -> list[str]:
    """``#`` heading lines (outside language-tagged code blocks) that do not render as headings."""
    tokens = MarkdownIt("commonmark").parse(text)
    rendered = {tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"}
    in_code = {line for t in tokens if t.type == "fence" and t.info.strip() and t.map
               for line in range(*t.map)}
    headings = [line.lstrip("#").strip() for number, line in enumerate(text.splitlines())
                if number not in in_code and re.match(r"#{1,6} ", line)]
    return [heading for heading in headings if heading not in rendered]


def python_fences(text: str) -> list[str]:
    """The contents of the ``python`` fenced blocks, as CommonMark renders ``text``."""
    return [t.content for t in MarkdownIt("commonmark").parse(text)
            if t.type == "fence" and t.info.split()[:1] == ["python"]]


PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)

# A README with a stray fence after a code block: the stray fence swallows the prose and the
# heading below it, closes on the next block's opening fence, and that block's closing fence then
# opens a block that runs to the end.
STRAY_FENCE = """\
# title

```python
x = 1
```
```

- a list item

## Layout

```
a/   the a folder
```
"""


def test_readme_opens_with_the_two_commands():
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    assert "handlerkit demo" in blocks[0] and "pip install" in blocks[0]
    assert "pytest" in blocks[1] and '".[test]"' in blocks[1]


def test_ci_runs_the_readme_test_command():
    awk = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "<!-- test-command -->" in awk
    marked = re.search(r"<!-- test-command -->\n```bash\n(.*?)\n```\n<!-- /test-command -->", README, re.S)
    assert marked, "README.md must mark its test command for .ci/run"
    extracted = subprocess.run(
        ["awk", "/<!-- test-command -->/{f=1; next} /<!-- \\/test-command -->/{f=0} f && /^[^`]/", "README.md"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert extracted == marked.group(1).strip()


@pytest.mark.parametrize("block", PYTHON_BLOCKS)
def test_python_blocks_run(block, monkeypatch):
    monkeypatch.chdir(ROOT)
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


# --- rendering -------------------------------------------------------------------------------


def test_readme_fences_are_all_closed():
    assert fence_problems(README) == []


def test_readme_headings_render_as_headings():
    assert unrendered_headings(README) == []
    assert {"What it is", "Layout"} <= {line[3:] for line in README.splitlines() if line.startswith("## ")}


def test_the_python_blocks_run_are_the_rendered_ones():
    assert PYTHON_BLOCKS and python_fences(README) == PYTHON_BLOCKS


def test_a_stray_fence_is_reported():
    problems = fence_problems(STRAY_FENCE)
    assert len(problems) == 1
    assert re.fullmatch(r"the ``` fence opened on line 14 is never closed: it runs to the end of the "
                        r"document \(line 14\) and turns everything after it into code", problems[0])
    assert unrendered_headings(STRAY_FENCE) == ["Layout"]
    fixed = STRAY_FENCE.replace("```\n```\n", "```\n", 1)
    assert fence_problems(fixed) == [] and unrendered_headings(fixed) == []


@pytest.mark.parametrize("text", [
    "```bash\necho hi\n",  # never closed
    "text\n\n~~~~\ncode\n~~~\n",  # a shorter closer does not close
    "```\n",  # opened on the last line
])
def test_unclosed_fences_are_reported(text):
    assert len(fence_problems(text)) == 1


@pytest.mark.parametrize("text", [
    "````markdown\n```python\nx = 1\n```\n````\n",  # a longer fence holds a shorter one
    "~~~\ncode\n~~~~~\n",  # a longer closer closes
    "```python\n# a comment, not a heading\n```\n",
    "no fences at all\n",
])
def test_closed_fences_pass(text):
    assert fence_problems(text) == [] and unrendered_headings(text) == []
