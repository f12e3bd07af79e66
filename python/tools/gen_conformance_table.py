"""Writes docs/engines/conformance.md from the engines' conformance records.

    python python/tools/gen_conformance_table.py RESULTS_DIR [--check]

RESULTS_DIR is where scripts/test-engines.sh had the engines write their records
(``LOGITS_PROCESSING_CONFORMANCE_DIR``; HF's record is made by python/tests/test_conformance.py).
``--check`` only says whether the page is up to date (exit 1 when not).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))

import conformance  # noqa: E402

PAGE = ROOT / "docs" / "engines" / "conformance.md"


def main(argv: list) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    records = conformance.load(argv[0])
    missing = [e for e in conformance.ENGINES if e not in records]
    if missing:
        print(f"no records for {missing} in {argv[0]}", file=sys.stderr)
        return 2
    text = conformance.table(records)
    if "--check" in argv[1:]:
        current = PAGE.read_text() if PAGE.exists() else ""
        print("up to date" if current == text else f"{PAGE} differs from the records", file=sys.stderr)
        return 0 if current == text else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
