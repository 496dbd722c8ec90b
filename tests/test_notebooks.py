"""The notebooks run headless, top to bottom, without an error (executed into a temporary copy)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ["01_format_throughput.ipynb", "02_loader_tuning.ipynb"]


def _python3_kernel() -> str:
    """Make sure a ``python3`` kernel spec exists (ipykernel ships one into the venv; install it if not).

    jupyter_client starts a spec whose argv[0] is ``python`` with ``sys.executable``, i.e. this
    virtualenv's interpreter, so the kernel sees the same packages as the tests.
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix"], check=True,
                       capture_output=True)
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, tmp_path):
    copy = tmp_path / name
    shutil.copy(NOTEBOOKS / name, copy)
    nb = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name=_python3_kernel(),
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the notebook drew no chart"


def test_committed_notebooks_match_build_script():
    """notebooks/_build.py is the source: the committed notebooks carry the same cell sources."""
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import _build
    finally:
        sys.path.pop(0)
    for name, cells in _build.NOTEBOOKS.items():
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        assert [c.source for c in nb.cells] == [src for _kind, src in cells], name


def test_committed_notebooks_have_outputs():
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), f"{name}: not executed"
        assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))
