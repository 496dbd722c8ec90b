"""A small training loop over ``make_loader``, run as its own process by tests/test_resume_loader.py
and tests/test_leftovers.py (also under ``torchrun``: ``--ddp``).

Usage: train_script.py OUT ROOT... [--workers W] [--batch B] [--epochs E] [--every K] [--sleep S]
                       [--resume] [--raise-at N] [--decode] [--ddp]

One loader per dataset ROOT, all stepped together: each training step takes the next batch of
every loader (they have the same number of batches per epoch in the tests; one that runs out
first simply stops contributing). For loader k, each delivered batch appends one JSON line
``{"epoch", "batch", "indices"}`` to OUT/log-<k>-<rank>.jsonl (line-buffered, so a SIGKILL loses
nothing written). Every K steps rank 0 saves ``{k: loader.state_dict()}`` with ``torch.save`` to
OUT/state.pt (a temp file, then a rename). ``--resume`` loads it first. After the first step,
OUT/pids-<rank>.json names this process and every loader worker. ``--raise-at N`` raises in
training step N. Under ``--ddp`` each step all-reduces a tensor (gloo), as DDP's backward does.
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


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("roots", nargs="+")
    p.add_argument("--workers", type=int, default=0)
    # worker processes: what the leftover and kill tests are about (make_loader's default may pick threads)
    p.add_argument("--kind", default="processes", choices=("auto", "processes", "threads"))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--decode", action="store_true")
    p.add_argument("--ddp", action="store_true")
    return p.parse_args()


def main() -> None:
    a = _args()
    rank = 0
    if a.ddp:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
        rank = dist.get_rank()
    loaders = [make_loader(open_dataset(root, return_index=True, decode=a.decode), batch_size=a.batch,
                           num_workers=a.workers, workers=a.kind, seed=3) for root in a.roots]
    state_file = a.out / "state.pt"
    if a.resume:
        saved = torch.load(state_file)
        for k, loader in enumerate(loaders):
            loader.load_state_dict(saved[k])
    logs = [open(a.out / f"log-{k}-{rank}.jsonl", "a", buffering=1) for k in range(len(loaders))]
    step = 0
    while _next_epoch(loaders[0]) < a.epochs:
        iters = [iter(loader) for loader in loaders]
        live = list(range(len(loaders)))
        while live:
            for k in list(live):
                try:
                    _images, _labels, idx = next(iters[k])
                except StopIteration:
                    live.remove(k)
                    continue
                entry = {"epoch": loaders[k].epoch, "batch": loaders[k].state_dict()["delivered"] - 1,
                         "indices": idx.tolist()}
                logs[k].write(json.dumps(entry) + "\n")
            if not live:
                break
            if step == 0:
                workers = [w.pid for it in iters for w in getattr(it, "_workers", [])]
                (a.out / f"pids-{rank}.json").write_text(json.dumps({"main": os.getpid(), "workers": workers}))
            if step == a.raise_at:
                raise RuntimeError(f"training step failed at step {step}")
            if a.ddp:
                grads = torch.ones(1)
                torch.distributed.all_reduce(grads)
            step += 1
            if step % a.every == 0 and rank == 0:
                tmp = a.out / "state.tmp"
                torch.save({k: loader.state_dict() for k, loader in enumerate(loaders)}, tmp)
                os.replace(tmp, state_file)
            time.sleep(a.sleep)
        del iters
    for log in logs:
        log.close()
    if a.ddp:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
