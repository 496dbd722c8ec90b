"""A small training loop over ``make_loader``, run as its own process by tests/test_resume_loader.py
and tests/test_leftovers.py (also under ``torchrun``: ``--ddp``).

Usage: train_script.py ROOT OUT [--workers W] [--batch B] [--epochs E] [--every K] [--sleep S]
                       [--resume] [--raise-at N] [--decode] [--ddp]

Each delivered batch appends one JSON line ``{"epoch", "batch", "indices"}`` to
OUT/log-<rank>.jsonl (flushed, so a SIGKILL loses nothing written). Every K
batches the loader's ``state_dict()`` is saved with ``torch.save`` to
OUT/state.pt (rank 0; written to a temp file and renamed). ``--resume`` loads
it first. After the first batch, OUT/pids-<rank>.json names this process and
its loader workers. ``--raise-at N`` raises in the training step of batch N.
Under ``--ddp`` each step all-reduces a tensor (gloo), as DDP's backward does.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from readers import make_loader, open_dataset


def _next_epoch(loader) -> int:
    state = loader.state_dict()
    return state["epoch"] + (1 if state["finished"] else 0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("out", type=Path)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--decode", action="store_true")
    p.add_argument("--ddp", action="store_true")
    a = p.parse_args()
    rank = 0
    if a.ddp:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        rank = dist.get_rank()
    ds = open_dataset(a.root, return_index=True, decode=a.decode)
    loader = make_loader(ds, batch_size=a.batch, num_workers=a.workers, seed=3)
    state_file = a.out / "state.pt"
    if a.resume:
        loader.load_state_dict(torch.load(state_file))
    log = open(a.out / f"log-{rank}.jsonl", "a", buffering=1)
    done = 0
    while _next_epoch(loader) < a.epochs:
        for _images, _labels, idx in loader:
            batch = loader.state_dict()["delivered"] - 1
            log.write(json.dumps({"epoch": loader.epoch, "batch": batch, "indices": idx.tolist()}) + "\n")
            if done == 0:
                workers = [w.pid for w in getattr(loader._iterator, "_workers", [])]
                (a.out / f"pids-{rank}.json").write_text(json.dumps({"main": os.getpid(), "workers": workers}))
            if done == a.raise_at:
                raise RuntimeError(f"training step failed at batch {done}")
            if a.ddp:
                step = torch.ones(1)
                torch.distributed.all_reduce(step)
            done += 1
            if done % a.every == 0 and rank == 0:
                tmp = a.out / "state.tmp"
                torch.save(loader.state_dict(), tmp)
                os.replace(tmp, state_file)
            time.sleep(a.sleep)
    log.close()
    if a.ddp:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
