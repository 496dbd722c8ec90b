"""The notebooks: each is a paired jupytext script (the source) and a committed, executed .ipynb.

The scripts run headless, top to bottom, without an error (executed into a
temporary folder); the committed notebooks carry the scripts' cells and the
outputs of a run.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("jupytext")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SCRIPTS = ["01_format_throughput.py", "02_loader_tuning.py", "03_training_outcome.py"]


def _load_build_script():
    """notebooks/build.py as a module (by path: the name ``build`` belongs to a PyPI package)."""
    spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOKS / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build_script()


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
@pytest.mark.parametrize("name", SCRIPTS)
def test_notebook_runs(name, tmp_path, monkeypatch):
    monkeypatch.setenv("NOTEBOOK_QUICK", "1")  # 03 trains at its benchmark's --quick size (the kernel inherits it)
    nb = build.from_script(NOTEBOOKS / name)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name=_python3_kernel(),
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the notebook drew no chart"


def test_discovers_every_script():
    assert build.NOTEBOOKS == SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_is_python(name):
    """The script itself compiles (magics are comments in percent format), so linters can read it."""
    compile((NOTEBOOKS / name).read_text(), name, "exec")


@pytest.mark.parametrize("name", SCRIPTS)
def test_committed_notebook_matches_script(name):
    """notebooks/<name>.py is the source: the committed .ipynb carries the same cells (build.py --check)."""
    py = NOTEBOOKS / name
    assert build.differences(py, py.with_suffix(".ipynb")) == []


def test_sync_check_sees_a_changed_cell(tmp_path):
    py = tmp_path / SCRIPTS[0]
    py.write_text((NOTEBOOKS / SCRIPTS[0]).read_text())
    ipynb = build.build(py)  # sources only, no outputs: no kernel needed
    assert build.differences(py, ipynb) == []
    py.write_text(py.read_text().replace("else 192", "else 193"))
    assert build.differences(py, ipynb) == ["cell 1: 01_format_throughput.ipynb differs from 01_format_throughput.py"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_committed_notebook_has_outputs(name):
    nb = nbformat.read((NOTEBOOKS / name).with_suffix(".ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), f"{name}: not executed"
    assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))
