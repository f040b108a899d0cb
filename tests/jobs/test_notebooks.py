"""The notebooks in notebooks/, executed end to end (nbclient, one kernel reset between them) against a real
broker holding the sample data jobs/notebooks.py makes in that kernel: a tiered topic, its Delta table synced to
the middle, a lagging consumer group. A cell that raises fails the test, naming the cell."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import nbformat

from broker.process import BrokerProcess
from jobs.notebooks import TIERING_BROKER, execute, notebooks, shop_env


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Path, nbformat.NotebookNode | Exception]]:
    """Every notebook executed in one kernel, which first makes the sample data with its own Spark
    session (not the suite's: this module runs beside the Spark tests on a parallel run)."""
    root = tmp_path_factory.mktemp("notebooks")
    broker = BrokerProcess(root / "broker", TIERING_BROKER).start()
    try:
        yield execute(notebooks(), shop_env(broker.bootstrap, str(root / "shop_clicks")),
                      prepare="from jobs.notebooks import make_sample; make_sample(3_000)")
    finally:
        broker.kill()


def test_there_are_notebooks() -> None:
    assert [p.name for p in notebooks()] == ["01_topic_history.ipynb", "02_table_topic.ipynb", "03_operations.ipynb"]


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_notebook_runs_without_errors(executed: dict[Path, nbformat.NotebookNode | Exception], path: Path) -> None:
    notebook = executed[path]
    if isinstance(notebook, Exception):
        raise notebook
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs) or path.stem == "02_table_topic"


def test_code_that_fails_before_the_notebooks_is_a_named_error_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match="failed in the notebook kernel: ValueError: no sample data"):
        execute([], {}, prepare="raise ValueError('no sample data')")
