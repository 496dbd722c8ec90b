"""``packer.progress.bar``: the one progress bar of the commands and ``pack_map`` (its settings, quiet,
bytes scaled by 1024), and the bars drawn with it by ``pack``, ``verify`` and ``pack_map``."""

from __future__ import annotations

import numpy as np

from packer import PackOptions, pack_map
from packer.cli import main as cli_main
from packer.progress import MININTERVAL, SMOOTHING, bar


def test_quiet_is_no_bar():
    assert bar(10, "img", "pack train", quiet=True) is None


def test_a_bar_has_the_projects_settings_and_draws_to_stderr(capsys):
    b = bar(3, "img", "verify x")
    try:
        assert (b.mininterval, b.smoothing, b.unit, b.total) == (MININTERVAL, SMOOTHING, "img", 3)
        assert callable(b.dynamic_ncols)  # tqdm keeps dynamic_ncols=True as the terminal's width function
        b.update(3)
    finally:
        b.close()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "verify x" in captured.err and "3/3" in captured.err and "img/s" in captured.err


def test_bytes_are_scaled_by_1024(capsys):
    b = bar(None, "B", "upload data")
    b.update(3 * 1024 * 1024)
    b.close()
    err = capsys.readouterr().err
    assert "upload data" in err and "3.00MB" in err


def test_pack_map_and_verify_draw_their_bars(tmp_path, capsys):
    def make(i: int) -> dict:
        return {"image": np.full((8, 8, 3), i, np.uint8), "label": 0}

    pack_map(make, range(5), tmp_path / "p", options=PackOptions(format="mmap"), progress=True)
    err = capsys.readouterr().err
    assert "pack_map" in err and "5/5" in err and "input/s" in err
    assert cli_main(["verify", str(tmp_path / "p")]) == 0
    captured = capsys.readouterr()
    assert "verify p" in captured.err and "5/5" in captured.err and "img" in captured.err
    assert cli_main(["verify", "-q", str(tmp_path / "p")]) == 0
    assert "verify p" not in capsys.readouterr().err


def test_the_pack_and_upload_bars_of_the_cli(tmp_path, capsys):
    from PIL import Image

    from packer.progress import upload_bars

    src = tmp_path / "pics" / "cat"
    src.mkdir(parents=True)
    for i in range(3):
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(src / f"{i}.png")
    assert cli_main([str(tmp_path / "pics"), "-f", "wds", "-o", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "pack pics" in err and "3/3" in err and "img" in err
    assert upload_bars(True)("data") is None
    tick = upload_bars(False)("data")
    assert tick is not None
    tick(2048)
    assert "upload data" in capsys.readouterr().err


def test_the_download_bar_of_verify(capsys):
    from packer.progress import download_bar

    assert download_bar(True) is None
    update = download_bar(False)
    assert update is not None
    update(1024, 4096)
    update(4096, 4096)  # done: the bar closes, drawn at its end
    err = capsys.readouterr().err
    assert "download" in err and "4.00k/4.00k" in err
