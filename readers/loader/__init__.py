"""Loading: ``make_loader`` and what feeds the GPU.

* :mod:`~readers.loader.dataloader` -- ``make_loader`` and ``PackedLoader``, a DataLoader with pinned
  memory, persistent workers, epochs and exact resume;
* :mod:`~readers.loader.collation` -- ``collate`` / ``Collate``: items into a batch, into shared memory
  from worker processes;
* :mod:`~readers.loader.threads` -- thread workers and the ``workers="auto"`` choice (``choose_workers``);
* :mod:`~readers.loader.shmspace` -- is ``/dev/shm`` big enough for the worker processes' batches;
* :mod:`~readers.loader.shmring` -- reusable shared-memory slots for whole batches;
* :mod:`~readers.loader.prefetch` -- the overlapped host-to-device copy;
* :mod:`~readers.loader.meter` -- is the GPU starving?

The top layer of ``readers``: it imports the formats, the order, the decode stack and the
contract; nothing imports it.
"""
