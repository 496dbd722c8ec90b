"""open_dataset on a folder a running pack holds says "being packed by pid N (started ...)", not
"never finished, --resume": the lock file is part of the on-disk contract (readers.contract.locks.LOCK_NAME)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import make_image_folder
from packer import PackOptions, pack
from readers import open_dataset
from readers.contract import locks, spec
from reliability_helpers import HOLD_LOCK, interrupt_after

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_open_dataset_names_the_pack_writing_the_folder(tmp_path):
    src = make_image_folder(tmp_path / "src" / "train", classes=2, per_class=8, size=(32, 32), png_every=0)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, PackOptions(format="wds", workers=1, shard_count=3), progress=interrupt_after(7))
    with pytest.raises(spec.IncompleteDatasetError, match="never finished.*--resume"):
        open_dataset(out)
    before = time.time()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(spec.IncompleteDatasetError) as err:
            open_dataset(out)
        text = str(err.value)
        assert text.startswith(f"{out}: being packed by pid {holder.pid} (started "), text
        assert text.endswith("): wait for it to finish, then open it") and "--resume" not in text, text
        started = re.search(r"started (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", text).group(1)
        assert abs(time.mktime(time.strptime(started, "%Y-%m-%d %H:%M:%S")) - before) < 60
        assert locks.lock_holder(out) == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        holder.stdout.close()
    assert locks.pack_in_progress(out) is None  # a killed holder's lock file is stale: free
    with pytest.raises(spec.IncompleteDatasetError, match="never finished.*--resume"):
        open_dataset(out)


def test_the_readers_know_the_lock_file_the_packer_takes():
    from packer import output

    assert output.LOCK_NAME == locks.LOCK_NAME and output.lock_holder is locks.lock_holder
