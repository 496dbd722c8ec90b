#!/usr/bin/env bash
# Set up a virtualenv in .venv with the project and its test/bench extras.
# torch is installed first, pinned to the CPU build that this project's machines
# carry (pip takes it from local disk); an unpinned torch would pull a multi-GB
# CUDA build. On a GPU machine, install the torch you want first: it is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
log=.venv/setup.log
run() { "$@" >"$log" 2>&1 || { cat "$log"; echo "setup failed: $*" >&2; exit 1; }; }
if ! python -c "import torch" 2>/dev/null; then
  run pip install "torch==${TORCH_VERSION:-2.13.0}"
fi
# The editable install also builds the optional native region decoder (setup.py: readers/decode/_jpegcrop.c over
# the system libjpeg-turbo) where a C compiler and jpeglib.h exist (Debian: apt-get install gcc
# libjpeg62-turbo-dev); without them it goes on, and the readers decode whole JPEGs.
run pip install -c <(python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" 2>/dev/null) -e ".[test]"
if ! python -c "from readers.decode import jpegcrop; assert jpegcrop.native_path()" 2>/dev/null; then
  echo "note: the native region decoder (readers/decode/_jpegcrop.c) was not built: it needs cc and libjpeg-turbo's jpeglib.h (Debian: apt-get install gcc libjpeg62-turbo-dev, then rerun this); the readers decode whole JPEGs" >&2
fi
# (ipykernel writes the spec through a tmp*_kernels folder that it leaves behind: once per venv, not per run)
if [ ! -f "$VIRTUAL_ENV/share/jupyter/kernels/python3/kernel.json" ]; then
  python -m ipykernel install --sys-prefix --name python3 >/dev/null 2>&1 || true
fi
