"""Rewrite each cited number of the README and docs/ whose data moved (after a bench or probe
run) to what the data says now, keeping its decimals: the link texts the CPU test
tests/test_docs_numbers.py holds to the data. Prints each change; the prose around a number
is for a person to reread.

    python probes/fix_doc_numbers.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_docs_numbers import CITATIONS, _json_value, _report_value  # noqa: E402

NUMBER = re.compile(r"\d+(?:\.\d+)?")

for page_name, text, cited, fragment, title in CITATIONS:
    page = next(p for p in (ROOT / "README.md", *(ROOT / "docs").glob("*.md"))
                if p.name == page_name)
    number = NUMBER.search(text)
    value = (_report_value(cited, fragment, title) if cited.name == "README.md"
             else _json_value(cited, title))
    if text[number.end():].lstrip().startswith("%"):
        value *= 100
    decimals = len(number.group().partition(".")[2])
    now = f"{value:.{decimals}f}"
    if now != number.group():
        new = text[:number.start()] + now + text[number.end():]
        body = page.read_text()
        target = f'[{text}]('
        anchor_part = f"#{fragment}" if fragment else ""
        pattern = re.compile(re.escape(target) + r'([^)\s]*' + re.escape(anchor_part)
                             + r') "' + re.escape(title) + '"\\)')
        body, n = pattern.subn(lambda m: f'[{new}]({m.group(1)} "{title}")', body)
        page.write_text(body)
        print(f"{page_name}: [{text}] -> [{new}] ({n} place{'s' * (n != 1)})")
