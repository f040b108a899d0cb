"""The notebooks in notebooks/, executed end to end (nbclient, one kernel reset between them) against a real
broker holding the sample data jobs/notebooks.py makes in that kernel: a tiered topic, its Delta table synced to
the middle, a lagging consumer group. A cell that raises fails the test, naming the cell; what the notebooks
print is checked against ground truth: the events produced (jobs.notebooks.sample_clicks), the broker's log
ends, the group's committed offsets."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import nbformat

from client import Admin
from broker.process import BrokerProcess
from jobs.notebooks import (
    PARTITIONS,
    TIERING_BROKER,
    TOPIC,
    dashboard_committed,
    execute,
    notebooks,
    sample_clicks,
    shop_env,
)

EVENTS = 3_000
# The module's first test also starts the kernel, its Spark JVM and the broker, makes the sample and
# runs every notebook: over the suite's 300 s per test at a load average of 20 on 2 cores.
pytestmark = pytest.mark.timeout(900)


@dataclass
class Executed:
    notebooks: dict[Path, nbformat.NotebookNode | Exception]
    log_ends: dict[int, int]  # the sample topic's, per partition, after the notebooks ran

    def notebook(self, stem: str) -> nbformat.NotebookNode:
        found = self.notebooks[next(p for p in self.notebooks if p.stem == stem)]
        if isinstance(found, Exception):
            raise found
        return found


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executed]:
    """Every notebook executed in one kernel, which first makes the sample data with its own Spark
    session (not the suite's: this module runs beside the Spark tests on a parallel run)."""
    root = tmp_path_factory.mktemp("notebooks")
    broker = BrokerProcess(root / "broker", TIERING_BROKER).start()
    try:
        results = execute(notebooks(), shop_env(broker.bootstrap, str(root / "shop_clicks")),
                          prepare=f"from jobs.notebooks import make_sample; make_sample({EVENTS})")
        with Admin(broker.bootstrap) as admin:
            ends = admin.list_offsets({(TOPIC, p): -1 for p in range(PARTITIONS)})
        yield Executed(results, {p: end for (_, p), (end, _) in ends.items()})
    finally:
        broker.kill()


def printed(notebook: nbformat.NotebookNode, code: str) -> str:
    """What the one code cell containing `code` printed (its stream outputs)."""
    [cell] = [c for c in notebook.cells if c.cell_type == "code" and code in c.source]
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def shown(text: str) -> list[list[list[str]]]:
    """The tables Spark's DataFrame.show() printed in `text`, each as rows of cells (header first)."""
    tables: list[list[list[str]]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("+") and not inside:
            tables.append([])
        elif line.startswith("|"):
            tables[-1].append([cell.strip() for cell in line.strip().strip("|").split("|")])
        inside = line.startswith(("|", "+"))
    return tables


def number(text: str) -> int:
    return int(text.replace(",", ""))


def pages(*batches: int) -> dict[str, int]:
    """Events per page in the sample's batches (0: the two days, 1: the hour before, 2: the last half hour)."""
    produced = sample_clicks(EVENTS, now_ms=0)
    counts: Counter[str] = Counter()
    for b in batches:
        counts.update(json.loads(value)["page"] for value in produced[b]["value"].to_pylist())
    return dict(counts)


def test_there_are_notebooks() -> None:
    assert [p.name for p in notebooks()] == ["01_topic_history.ipynb", "02_table_topic.ipynb", "03_operations.ipynb"]


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_notebook_runs_without_errors(executed: Executed, path: Path) -> None:
    notebook = executed.notebook(path.stem)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs) or path.stem == "02_table_topic"


def test_topic_history_notebook_counts_every_event_once(executed: Executed) -> None:
    """01: the total, the per-partition table, the page and date breakdowns of one reused
    DataFrame all cover exactly the events produced; the last ten minutes' pages add up (at
    most: each query takes its own current_timestamp(), so an event can leave the window)."""
    notebook = executed.notebook("01_topic_history")
    overview = printed(notebook, "total = clicks.count()")
    assert f"{EVENTS:,} events" in overview
    [per_partition] = shown(overview)
    assert per_partition[0] == ["partition", "events", "first offset", "last offset"]
    assert [[number(c) for c in row] for row in per_partition[1:]] == [
        [p, end, 0, end - 1] for p, end in sorted(executed.log_ends.items())]

    by_page, by_date = shown(printed(notebook, "by_page = "))
    assert {r[0]: number(r[1]) for r in by_page[1:]} == pages(0, 1, 2)
    assert by_date[0] == ["date", "count"] and sum(number(r[1]) for r in by_date[1:]) == EVENTS

    recent = printed(notebook, "INTERVAL 10 MINUTES")
    in_last_ten = number(re.search(r"([\d,]+) events in the last ten minutes", recent).group(1))
    [recent_pages] = shown(recent)
    assert 0 < in_last_ten <= EVENTS // 4 and 0 < sum(number(r[1]) for r in recent_pages[1:]) <= in_last_ten


def test_table_topic_notebook_shows_the_synced_versions(executed: Executed) -> None:
    """02: the sync commits' offsets, the first version's rows and pages, the table's rows now."""
    notebook = executed.notebook("02_table_topic")
    [log] = shown(printed(notebook, "DeltaTable.forPath"))
    reached = [sum(int(n) for n in re.findall(r'"\d+": (\d+)', row[2])) for row in log[1:] if row[2] != "NULL"]
    assert reached == [EVENTS // 2, 3 * EVENTS // 4]
    travel = printed(notebook, "versionAsOf")
    assert f"version 1: {EVENTS // 2:,} rows; now: {3 * EVENTS // 4:,} rows" in travel
    [first_pages] = shown(travel)
    assert {r[0]: number(r[1]) for r in first_pages[1:]} == pages(0)


def test_operations_notebook_shows_the_groups_lag_and_the_log_ends(executed: Executed) -> None:
    """03: each partition's committed offset, log end and lag, and the tiering's log ends."""
    notebook = executed.notebook("03_operations")
    lag = printed(notebook, "admin.group_lag")
    for p, end in executed.log_ends.items():
        committed = dashboard_committed(p, end)
        assert f"partition {p}: committed {committed:,}, log end {end:,}, lag {end - committed:,}" in lag
    tiering = printed(notebook, "describe_tiering")
    assert {int(p): int(end) for p, end in re.findall(r"partition (\d+): local \[\d+, (\d+)\)", tiering)} == executed.log_ends


def test_code_that_fails_before_the_notebooks_is_a_named_error_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match="failed in the notebook kernel: ValueError: no sample data"):
        execute([], {}, prepare="raise ValueError('no sample data')")
