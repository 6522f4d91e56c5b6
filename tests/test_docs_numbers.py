"""CPU: every measured number of the README and docs/ links the data it comes from, and says
that data, so the pages cannot drift from the stored results.

A number links a row of a generated report, ``[152.9 us](../reports/nvidia-h200/README.md#pool-
b-4096-k-256-forward "tuned")``, whose title names the quantity: a provider's median time
(``tuned``), ``call:`` or ``bare:`` before it for the host cost of a call or of its bare
launches, or the ratio of two (``floor/tuned``: the share of the floor). Or it links a probe's
JSON file, its title a path of keys (``*``/``?`` wildcards) whose values' median it is."""
from __future__ import annotations

import fnmatch
import json
import re
import statistics
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from pycuda_heads.report import data as report_data
from pycuda_heads.report.tables import anchor

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r'\[([^\]]+)\]\(([^)\s]+) "([^"]+)"\)')
FIELDS = {"call": "python_call_us", "bare": "bare_launch_us"}


def _citations() -> list[tuple[str, str, Path, str, str]]:
    """(page, link text, file cited, anchor, title) of every cited number."""
    out = []
    for page in PAGES:
        for text, target, title in LINK.findall(page.read_text()):
            path, _, fragment = target.partition("#")
            cited = (page.parent / path).resolve()
            if ROOT / "reports" in cited.parents:
                out.append((page.name, text, cited, fragment, title))
    return out


CITATIONS = _citations()


@lru_cache(maxsize=None)
def _rows(gpu_dir: Path) -> dict[str, report_data.BenchResult]:
    """anchor -> the row the report shows under it."""
    data = report_data.load(gpu_dir)
    rows = {anchor(c.op, c.shape, c.pass_): c for c in report_data.cases(data.bench)}
    for op, results in (("step", report_data.step_results(data.bench)),
                        ("train_step", report_data.whole_step_results(data.bench)[0]),
                        ("torch_train", report_data.train_results(data.bench))):
        rows.update({anchor(op, shape): report_data.BenchResult(op, shape, "", by)
                     for shape, by in results.items()})
    return rows


def _term(case: report_data.BenchResult, term: str) -> float | None:
    field, _, provider = term.rpartition(":")
    if not field:
        return case.time(provider)
    row = case.rows.get(provider) or {}
    return None if row.get("error") else row.get(FIELDS[field])


def _report_value(report: Path, fragment: str, title: str) -> float:
    assert f'id="{fragment}"' in report.read_text(), f"{report} has no row #{fragment}"
    case = _rows(report.parent)[fragment]
    values = [_term(case, t) for t in title.split("/")]
    assert None not in values, f"#{fragment} has no {title}"
    return values[0] / values[1] if len(values) == 2 else values[0]


def _leaves(node: Any, keys: list[str]) -> list[Any]:
    if not keys:
        return [node]
    if isinstance(node, list):
        node = {str(i): v for i, v in enumerate(node)}
    return [leaf for k, v in (node.items() if isinstance(node, dict) else ())
            if fnmatch.fnmatchcase(k, keys[0]) for leaf in _leaves(v, keys[1:])]


def _json_value(path: Path, title: str) -> float:
    found = _leaves(json.loads(path.read_text()), title.split("/"))
    assert found and all(isinstance(v, (int, float)) for v in found), f"{path.name}: {title}"
    return statistics.median(found)


def test_the_pages_cite_their_numbers():
    assert len(CITATIONS) >= 20
    assert {page for page, *_ in CITATIONS} >= {"README.md", "kernels.md", "benchmarks.md"}


@pytest.mark.parametrize("page,text,cited,fragment,title", CITATIONS,
                         ids=[f"{c[0]}:{c[1]}:{c[3] or c[2].name}" for c in CITATIONS])
def test_each_cited_number_is_what_its_data_says(page, text, cited, fragment, title):
    number = re.search(r"\d+(?:\.\d+)?", text)
    assert number, f"{page}: the link [{text}] holds no number"
    value = (_report_value(cited, fragment, title) if cited.name == "README.md"
             else _json_value(cited, title))
    if text[number.end():].lstrip().startswith("%"):
        value *= 100
    decimals = len(number.group().partition(".")[2])
    assert abs(value - float(number.group())) <= 0.5 * 10 ** -decimals + 1e-9, \
        f"{page}: [{text}] but the data says {value:.4g}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_time_is_written_without_its_source(page):
    # a time in us outside a link would be a number no test holds to the data
    bare = LINK.sub("", page.read_text())
    assert not re.findall(r"\d+(?:\.\d+)? us\b", bare)
