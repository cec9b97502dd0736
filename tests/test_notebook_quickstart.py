"""The quickstart notebook runs headless from top to bottom without an error."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "workflows" / "notebooks" / "quickstart.ipynb"


@pytest.mark.slow  # a Jupyter kernel runs the notebook's fits: 27 s on 2 cores
def test_quickstart_notebook_executes(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="notebook tests need the dev extra (nbformat)")
    nbclient = pytest.importorskip("nbclient", reason="notebook tests need the dev extra (nbclient)")
    pytest.importorskip("ipykernel", reason="notebook tests need the dev extra (ipykernel)")
    pytest.importorskip("matplotlib", reason="the notebook plots with matplotlib (dev and plot extras)")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    scratch = tmp_path / "tmp"  # the kernel's temporary folder, private: other processes write to /tmp too
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the kernel, a new process, inherits it
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert not list(scratch.glob("daskkrr-*"))  # its working directory is removed (it was left in /tmp)
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "Dask dashboard: http://127.0.0.1:" in text and "/daskkrr" in text
    assert "class='daskkrr-progress'" in html and ">done<" in html  # the bar, finished
    assert "CG iterations" in text and "test RMSE" in text
    assert "reloaded model predicts the same: True" in text
    images = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    (tmp_path / "figures.png").write_bytes(base64.b64decode(images[0]))
