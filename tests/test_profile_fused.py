"""benchmarks/profile_fused.py --quick runs, and its table adds up: each transform's glue is what is left
of the whole transform after its region decode and its resize (issue 37, item 1)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_quick_profile_times_every_step(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("profile_fused", ROOT / "benchmarks" / "profile_fused.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick", "--json", str(tmp_path / "p.json")]) == 0
    rows = {r["step"]: r for r in json.loads((tmp_path / "p.json").read_text())["rows"]}
    for kind in ("eval", "train"):
        whole = rows[f"{kind}: whole transform"]
        parts = [rows[f"{kind}: region decode (as the transform asks)"],
                 rows[f"{kind}: resize (torch, as the transform asks)"]]
        assert whole["median_us"] > 0 and all(p["median_us"] > 0 for p in parts)
        glue = rows[f"{kind}: glue (whole - decode - resize)"]["median_us"]
        assert abs(whole["median_us"] - sum(p["median_us"] for p in parts) - glue) < 1e-6
    assert "| eval: whole transform |" in capsys.readouterr().out
