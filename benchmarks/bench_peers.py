"""Side by side with the peers: ``dataset-bench --peers`` as a script (see ``dataset_bench/sidecli.py``).

    python benchmarks/bench_peers.py --json side.json --chart side.png   # ~15 min on 2 cores
    python benchmarks/bench_peers.py --quick                             # under a minute (CI)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing

from dataset_bench.sidecli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
