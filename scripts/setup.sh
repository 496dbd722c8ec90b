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
run pip install -c <(python -c "import torch; print('torch==' + torch.__version__.split('+')[0])" 2>/dev/null) -e ".[test]"
# The optional native region decoder (readers/_jpegcrop.c, over the system libjpeg-turbo): needs a C
# compiler and jpeglib.h (Debian: apt-get install gcc libjpeg62-turbo-dev). Without it the readers
# decode whole JPEGs, as before.
if ! python -c "from readers import jpegcrop; jpegcrop.build()" 2>"$log"; then
  echo "note: readers/_jpegcrop.so not built (needs cc and libjpeg-turbo headers: $(tail -n 1 "$log")); the readers decode whole JPEGs" >&2
fi
python -m ipykernel install --sys-prefix --name python3 >/dev/null 2>&1 || true
