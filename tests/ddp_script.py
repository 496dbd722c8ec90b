"""Run by tests/test_ddp.py under ``torchrun --nproc_per_node=2 --standalone``: one DDP-style job.

Usage: ddp_script.py OUT_DIR DATASET_ROOT...

For every dataset: ``make_loader`` (2 forked workers, batch 4, shuffle, seed 0) for 2 epochs over
the gloo process group (and a 0.75 / 0.25 mixture of the lmdb and wds datasets, stopped mid-epoch
and resumed from ``state_dict`` in a new loader). After every batch the ranks all-reduce a tensor, as DDP's backward pass
does with gradients: a rank that ran out of batches early would leave the other one blocked there
(and the all-reduce after the epoch would then pair up with the wrong call), so the job ending at
all proves the ranks stayed in step. Each rank writes OUT_DIR/rank<r>.json: per dataset, per
epoch, the sample indices it saw (in order) and its batch count.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from readers import make_loader, mix, open_dataset

EPOCHS = 2
WORKERS = 2
BATCH = 4


def main() -> None:
    out, roots = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    result = {"rank": rank, "world_size": world, "env_world_size": int(os.environ["WORLD_SIZE"]), "datasets": {}}
    for root in roots:
        ds = open_dataset(root, return_index=True)
        loader = make_loader(ds, batch_size=BATCH, num_workers=WORKERS, seed=0)
        epochs = []
        for _ in range(EPOCHS):
            seen, batches = [], 0
            for _images, _labels, idx in loader:
                seen += idx.tolist()
                batches += 1
                step = torch.ones(1)
                dist.all_reduce(step)  # the "gradient" sync of one training step
                assert step.item() == world
            totals = torch.tensor([batches, len(seen)], dtype=torch.int64)
            dist.all_reduce(totals)  # after each epoch
            epochs.append({"indices": seen, "batches": batches, "all_reduced": totals.tolist(),
                           "epoch": loader.epoch})
        result["datasets"][root] = {
            "format": ds.format,
            "sampler": type(loader.sampler).__name__ if loader.sampler is not None else None,
            "distributed_sampler": isinstance(loader.sampler, torch.utils.data.DistributedSampler),
            "len_loader": len(loader),
            "epochs": epochs,
        }
        del loader
    result["mixture"] = _mixture(roots)
    dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _mixture(roots: list[str]) -> dict:
    """One epoch of a 0.75 / 0.25 mixture (an lmdb and a wds source), stopped after 2 batches: the
    state goes to a new loader, which delivers the rest. Per rank: (source, index) pairs before and
    after the resume, the batches, ``len(loader)`` and ``source_counts``."""
    by_format = {open_dataset(r).format: r for r in roots}

    def loader():
        sources = [(open_dataset(by_format["lmdb"], return_index=True), 0.75),
                   (open_dataset(by_format["wds"], return_index=True), 0.25)]
        return make_loader(mix(sources, samples_per_epoch=24, seed=3, return_source=True),
                           batch_size=BATCH, num_workers=WORKERS, seed=0)

    first, before, after = loader(), [], []
    for step, (_images, _labels, idx, src) in enumerate(first):
        before += list(zip(src.tolist(), idx.tolist()))
        dist.all_reduce(torch.ones(1))
        if step == 1:
            break
    state = first.state_dict()
    del first
    second = loader()
    second.load_state_dict(state)
    batches = 2
    for _images, _labels, idx, src in second:
        after += list(zip(src.tolist(), idx.tolist()))
        dist.all_reduce(torch.ones(1))
        batches += 1
    return {"before": before, "after": after, "batches": batches, "len_loader": len(second),
            "source_counts": second.source_counts()}


if __name__ == "__main__":
    main()
