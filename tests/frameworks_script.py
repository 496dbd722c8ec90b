"""Run by tests/test_frameworks.py under a real launcher: ``accelerate launch --cpu --num_processes 2``
(``accelerate`` mode) or plain ``python`` (``lightning`` mode: the Trainer launches its own 2 DDP
processes on the CPU).

Usage: frameworks_script.py MODE OUT_DIR DATASET_ROOT...

For every dataset, 2 epochs of ``make_loader(open_dataset(root, decode=False, return_index=True))``
batches as the framework hands them to the training step. Each batch must still be a ByteBatch whose
samples match the index checksums. Each rank writes OUT_DIR/<mode>-rank<r>.json: per dataset, per
epoch, the sample indices it saw.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from pathlib import Path

import torch

from readers import make_loader, open_dataset
from readers.loader.shmring import ByteBatch

EPOCHS, BATCH = 2, 4


def check(batch, index) -> list[int]:
    """The batch's sample indices, after checking it survived the framework intact."""
    data, labels, idx = batch
    assert isinstance(data, ByteBatch), f"the framework turned a ByteBatch into {type(data)}"
    ids = idx.tolist()
    assert len(data) == len(ids) == len(labels)
    sums = index.arrays["checksums"]
    for k, i in enumerate(ids):
        assert zlib.crc32(data.get(k)) & 0xFFFFFFFF == int(sums[i]), f"sample {i} damaged in transit"
    return ids


def run_accelerate(out: Path, roots: list[str]) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    result: dict = {"rank": acc.process_index, "world": acc.num_processes, "datasets": {}}
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt = acc.prepare(model, opt)
    for root in roots:
        for distributed in (None, False):
            if distributed is False and "wds" in Path(root).name:
                continue  # accelerate would dispatch an iterable's batches: see README (frameworks)
            ds = open_dataset(root, decode=False, return_index=True)
            # forkserver: this rank forks seven loaders' workers in a row while gloo's and the earlier
            # loaders' threads come and go; one CI run hung in a worker stuck in CPython's after-fork
            # clean-up (PyOS_AfterFork_Child waiting on a lock another thread held at the fork).
            made = make_loader(ds, batch_size=BATCH, num_workers=1, distributed=distributed,
                               multiprocessing_context="forkserver")
            loader = acc.prepare(made)
            assert (loader is made) == (distributed is None), "accelerate wrapped a per-rank loader (or did not)"
            epochs = []
            for _ in range(EPOCHS):
                seen = []
                for batch in loader:
                    seen += check(batch, ds.index)
                    loss = model(torch.ones(1, 1)).sum()
                    acc.backward(loss)
                    opt.step()
                epochs.append(seen)
            result["datasets"][f"{root}|{distributed}"] = epochs
    (out / f"accelerate-rank{acc.process_index}.json").write_text(json.dumps(result))
    acc.wait_for_everyone()
    acc.end_training()


def run_lightning(out: Path, roots: list[str]) -> None:
    import lightning as L
    from lightning.pytorch.utilities import CombinedLoader

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: dict[str, list[list[int]]] = {root: [] for root in roots}
            self.indexes = {}

        def train_dataloader(self):
            loaders = {}
            for root in roots:
                ds = open_dataset(root, decode=False, return_index=True)
                self.indexes[root] = ds.index
                loaders[root] = make_loader(ds, batch_size=BATCH, num_workers=1)
            return CombinedLoader(loaders, mode="max_size")

        def on_train_epoch_start(self) -> None:
            for root in roots:
                self.seen[root].append([])

        def training_step(self, batch, batch_idx):
            for root, part in batch.items():
                if part is not None:
                    self.seen[root][-1] += check(part, self.indexes[root])
            return self.layer(torch.ones(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    module = Module()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=EPOCHS, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    rank = trainer.global_rank
    result = {"rank": rank, "world": trainer.world_size, "datasets": {f"{r}|None": module.seen[r] for r in roots}}
    (out / f"lightning-rank{rank}.json").write_text(json.dumps(result))


def main() -> None:
    mode, out, roots = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    {"accelerate": run_accelerate, "lightning": run_lightning}[mode](out, roots)


if __name__ == "__main__":
    main()
