"""The analysis notebook runs top to bottom on the committed reference results (so it never rots)."""
from pathlib import Path

import pytest
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_analysis_notebook_executes_on_the_reference_results():
    nb = nbformat.read(ROOT / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 3  # window, scaling, collapse at least
    text = "".join(o.get("text", "") for o in outputs)
    assert "tau_mem_vs_n" in text and "Advice for N =" in text
