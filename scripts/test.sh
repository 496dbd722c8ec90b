#!/usr/bin/env bash
# Quickstart command 2: set up, then run the whole test suite.
# On every core (pytest-xdist, -n auto): tests/conftest.py says which tests share a worker and which start
# first; PYTEST_WORKERS=0 runs it in one process, PYTEST_WORKERS=3 on three workers (docs/measuring.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m mypy  # the packages [tool.mypy] lists in pyproject.toml type-check with zero errors
python -m pytest -n "${PYTEST_WORKERS:-auto}" "$@"
