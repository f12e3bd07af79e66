"""The fenced code blocks of README.md and every page under docs/, and how each is checked.

A block's info string is its language, then optional words:

- ```` ```python ````: runs in the main venv (``test_docs.py``); the blocks of one page run in
  order in one namespace, as a reader would paste them.
- ```` ```python engine=vllm ```` / ```` engine=sglang ````: runs in that engine's venv
  (``test_docs_engines.py``, from ``scripts/test-engines.sh``), as a script of its own.
- ```` ```sh ```` / ```` ```bash ````: runs with bash (``-e -o pipefail``) in an empty temporary
  directory, the venv's commands first on ``PATH``.
- ```` ```json ````: parsed; a spec (or a list of specs) is checked by ``validate_specs``.
- ```` ```rust ````: a doc test of the crate that includes the page (``#[doc = include_str!]``).
- ```` ```text ````: output shown, not code.
- ``no-run: REASON`` after the language: not run, and the reason says why (a GPU, a download, a
  server, minutes of build, what runs it instead).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\S*)(.*?)\n(.*?)^```[ \t]*$", re.S | re.M)


@dataclass
class Block:
    page: str  # relative to the repository's root
    line: int
    lang: str
    words: str  # the rest of the info string
    code: str

    @property
    def no_run(self) -> str | None:
        match = re.search(r"no-run:\s*(.*)", self.words)
        return match.group(1).strip() if match else None

    @property
    def engine(self) -> str | None:
        match = re.search(r"engine=(\w+)", self.words)
        return match.group(1) if match else None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [
        Block(str(page.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group(1),
              m.group(2).strip(), m.group(3))
        for m in FENCE.finditer(text)
    ]


def all_blocks() -> list[Block]:
    return [b for page in pages() for b in blocks(page)]
