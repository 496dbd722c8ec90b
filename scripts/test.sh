#!/usr/bin/env bash
# Quickstart command 2: set up, then run the whole test suite.
# On every core and one more (pytest-xdist, -n cores+1): tests/conftest.py says which tests share a worker and which start
# first; PYTEST_WORKERS=0 runs it in one process, PYTEST_WORKERS=3 on three workers (docs/measuring.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# Azurite, the Azure Storage emulator of the az:// tests, from the npm registry (once; Node.js is on the machines)
if command -v npm >/dev/null && [ ! -x .cache/azurite/node_modules/.bin/azurite-blob ]; then
  npm install --silent --no-audit --no-fund --prefix .cache/azurite azurite@3.37 >/dev/null \
    || echo "warning: could not install Azurite from npm; the az:// tests will skip"
fi
python -m mypy  # the packages [tool.mypy] lists in pyproject.toml type-check with zero errors
# one worker more than there are cores: many tests wait on child processes, servers and sleeps (docs/measuring.md)
python -m pytest -n "${PYTEST_WORKERS:-$(( $(nproc) + 1 ))}" "$@"
