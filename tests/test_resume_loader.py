"""Exact mid-epoch resume: PackedLoader.state_dict() / load_state_dict() for every reader.

In-process checks (every format, 0 and 2 workers, persistent workers, uneven worker batch counts,
simulated DDP ranks, changed world size / worker count / batch size) and, marked slow, real training
processes killed with SIGKILL mid-epoch and restarted from their last saved state (alone and as 2
DDP ranks under torchrun/gloo).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import get_worker_info

import readers.contract.env
from conftest import make_image_folder
from packer import PackOptions, pack
from readers import make_loader, open_dataset
from readers.contract.env import WorkerEnv
from readers.formats import shardbatch
from readers.formats.wds import ShardDataset
from readers.contract.spec import FORMATS

SCRIPT = Path(__file__).with_name("train_script.py")


@pytest.fixture(scope="module")
def packed41(tmp_path_factory) -> dict[str, Path]:
    """41 samples (prime: 2 workers get 21 and 20, so with batch 4 one worker runs dry first)."""
    root = tmp_path_factory.mktemp("resume41")
    src = make_image_folder(root / "src", classes=1, per_class=41, size=(24, 20), seed=9)
    out = {}
    for fmt in FORMATS:
        pack(src, root / fmt, PackOptions(format=fmt, workers=1, **({"shard_count": 6} if fmt == "wds" else {})))
        out[fmt] = root / fmt
    return out


def loader_for(root, workers, batch=4, **kw):
    ds = open_dataset(root, decode=False, return_index=True)
    return make_loader(ds, batch_size=batch, num_workers=workers, seed=kw.pop("seed", 1),
                       workers=kw.pop("kind", "auto"), **kw)


def run_epoch(loader) -> list[list[int]]:
    return [b[2].tolist() for b in loader]


def take(loader, k: int) -> list[list[int]]:
    out = []
    for b in loader:
        out.append(b[2].tolist())
        if len(out) == k:
            break
    return out


def flat(batches) -> list[int]:
    return [i for b in batches for i in b]


WORKERS = [0, pytest.param(2, marks=pytest.mark.slow)]  # worker processes: slow by the suite's rule


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_resume_continues_the_uninterrupted_order(packed41, fmt, workers):
    ref = loader_for(packed41[fmt], workers)
    epochs = [run_epoch(ref) for _ in range(3)]
    del ref
    assert epochs[1] != epochs[2]
    for k in (1, 4, len(epochs[1]) - 1, len(epochs[1])):
        first = loader_for(packed41[fmt], workers)
        run_epoch(first)
        got = take(first, k)
        state = first.state_dict()
        assert state["epoch"] == 1 and state["delivered"] == k
        buf = io.BytesIO()
        torch.save(state, buf)  # plain data
        json.dumps(state)
        del first
        again = loader_for(packed41[fmt], workers)
        again.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
        assert again.state_dict() == state  # not applied yet: the same state comes back
        rest = run_epoch(again)
        assert got + rest == epochs[1], f"k={k}: the resumed epoch is not the rest of the uninterrupted one"
        assert run_epoch(again) == epochs[2], "the epoch after the resumed one differs"
        del again


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_resume_on_a_live_loader_with_persistent_workers(packed41, fmt):
    ref = loader_for(packed41[fmt], 2)
    epochs = [run_epoch(ref) for _ in range(2)]
    del ref
    live = loader_for(packed41[fmt], 2, persistent_workers=True, kind="processes")
    got = take(live, 3)
    state = live.state_dict()
    workers = [w.pid for w in live._iterator._workers]
    run_epoch(live)  # epoch 1 with the same workers
    live.load_state_dict(state)
    rest = run_epoch(live)
    assert [w.pid for w in live._iterator._workers] == workers, "workers were restarted"
    assert got + rest == epochs[0]
    assert run_epoch(live) == epochs[1]
    # a second interruption inside the resumed epoch
    live.load_state_dict(state)
    more = take(live, 2)
    state2 = live.state_dict()
    assert state2["delivered"] == 5
    live.load_state_dict(state2)
    assert got + more + run_epoch(live) == epochs[0]
    del live


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_changed_workers_or_batch_size_deliver_the_rest_exactly_once(packed41, fmt):
    first = loader_for(packed41[fmt], 2)
    got = take(first, 3)
    state = first.state_dict()
    del first
    for workers, batch in ((0, 4), (1, 5), (2, 3)):
        other = loader_for(packed41[fmt], workers, batch=batch)
        other.load_state_dict(state)
        rest = run_epoch(other)
        assert sorted(flat(got) + flat(rest)) == list(range(41)), (workers, batch)
        # and a second checkpoint inside that resumed epoch still adds up
        again = loader_for(packed41[fmt], workers, batch=batch)
        again.load_state_dict(state)
        part = take(again, 2)
        third = loader_for(packed41[fmt], 0, batch=7)
        third.load_state_dict(again.state_dict())
        assert sorted(flat(got) + flat(part) + flat(run_epoch(third))) == list(range(41))
        del other, again, third


def _hook(rank, world):
    def env():  # a worker process's id, or a loader thread's (make_loader may pick either)
        info, thread = get_worker_info(), readers.contract.env.thread_worker()
        if info is not None:
            return WorkerEnv(rank, world, info.id, info.num_workers)
        return WorkerEnv(rank, world, *((thread.worker_id, thread.num_workers) if thread else (0, 1)))
    return env


def _ranks_epoch(root, world, monkeypatch, workers=0, state=None, batch=4, k=None):
    """Each simulated rank's batches (all, or the first k) and its state."""
    out, states = [], []
    for r in range(world):
        monkeypatch.setattr(readers.contract.env, "worker_env_hook", _hook(r, world))
        loader = loader_for(root, workers, batch=batch)
        if state is not None:
            loader.load_state_dict(state)
        out.append(run_epoch(loader) if k is None else take(loader, k))
        states.append(loader.state_dict())
        del loader
    monkeypatch.undo()
    return out, states


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_ddp_ranks_resume_exactly_and_at_another_world_size(packed41, fmt, workers, monkeypatch):
    full, _ = _ranks_epoch(packed41[fmt], 2, monkeypatch, workers)
    part, states = _ranks_epoch(packed41[fmt], 2, monkeypatch, workers, k=3)
    assert states[0] == states[1], "ranks disagree on the loader state (rank 0's is the one saved)"
    rest, _ = _ranks_epoch(packed41[fmt], 2, monkeypatch, workers, state=states[0])
    for r in range(2):
        assert part[r] + rest[r] == full[r], f"rank {r}"
    for world in (1, 3):
        others, _ = _ranks_epoch(packed41[fmt], world, monkeypatch, 0, state=states[0])
        delivered = Counter(flat(part[0]) + flat(part[1]) + [i for o in others for i in flat(o)])
        assert set(delivered) == set(range(41)), f"world 2 -> {world}: samples lost"
        # repeats: at most the padding of each world size (1 for 2 ranks at 41, 2 for 3 ranks)
        assert sum(delivered.values()) - 41 <= (2 - 1) + (world - 1)


def test_skipping_reads_nothing(packed41, monkeypatch):
    """Restoring costs index arithmetic: only the samples still to deliver are read."""
    for fmt in FORMATS:
        first = loader_for(packed41[fmt], 0)
        got = take(first, 6)
        state = first.state_dict()
        reads = []
        if fmt == "wds":
            orig = ShardDataset.read_from
            monkeypatch.setattr(ShardDataset, "read_from", lambda self, fd, s, i: reads.append(i) or orig(self, fd, s, i))
            whole = shardbatch.read_batch  # whole-batch reads (make_loader's Pending samples) count too
            monkeypatch.setattr(shardbatch, "read_batch", lambda ds, maps, idx, alloc=None: reads.extend(
                idx.tolist()) or whole(ds, maps, idx, alloc))
        again = loader_for(packed41[fmt], 0)
        if fmt != "wds":
            orig_many = type(again.dataset).read_many
            monkeypatch.setattr(type(again.dataset), "read_many",
                                lambda self, idx, orig=orig_many: reads.extend(idx) or orig(self, idx))
            orig_batch = type(again.dataset).get_batch  # whole-batch reads (readers.formats.batch) count too
            monkeypatch.setattr(type(again.dataset), "get_batch", lambda self, idx, alloc=None, orig=orig_batch: (
                reads.extend(idx) if self.batchable() else None) or orig(self, idx, alloc))
        again.load_state_dict(state)
        rest = flat(run_epoch(again))
        assert sorted(reads) == sorted(rest) and len(rest) == 41 - len(flat(got)), fmt
        monkeypatch.undo()


def test_state_rejects_another_dataset(packed41, packed_generated):
    state = loader_for(packed41["lmdb"], 0).state_dict()
    with pytest.raises(ValueError, match="num_samples"):
        loader_for(packed_generated["lmdb"], 0).load_state_dict(state)
    with pytest.raises(ValueError, match="kind"):
        loader_for(packed41["wds"], 0).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        loader_for(packed41["lmdb"], 0).load_state_dict({"epoch": 3})


def test_finished_epoch_state_starts_the_next_epoch(packed41):
    ref = loader_for(packed41["hdf5"], 0)
    epochs = [run_epoch(ref) for _ in range(3)]
    a = loader_for(packed41["hdf5"], 0)
    run_epoch(a)
    run_epoch(a)
    b = loader_for(packed41["hdf5"], 0)
    assert a.state_dict()["finished"] and a.state_dict()["epoch"] == 1
    b.load_state_dict(a.state_dict())
    assert (b.state_dict()["epoch"], b.state_dict()["delivered"]) == (2, 0)
    assert run_epoch(b) == epochs[2] and b.epoch == 2


def test_an_epoch_set_on_the_sampler_is_taken_up(packed41):
    """Lightning sets the sampler's epoch (not the loader's) at each epoch start."""
    ref = loader_for(packed41["mmap"], 0)
    ref.set_epoch(4)
    want = run_epoch(ref)
    loader = loader_for(packed41["mmap"], 0)
    loader.sampler.set_epoch(4)
    assert run_epoch(loader) == want and loader.epoch == 4


# --------------------------------------------------------------------------- real processes, SIGKILL


def _log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _before(entries: list[dict], state: dict) -> list[int]:
    """What was delivered before the checkpoint ``state`` (earlier epochs, and batches < delivered)."""
    cut = (state["epoch"] + (1 if state["finished"] else 0), 0 if state["finished"] else state["delivered"])
    return flat(e["indices"] for e in entries if (e["epoch"], e["batch"]) < cut)


def _kill_when_checkpointed(proc: subprocess.Popen, out: Path, epoch: int, group: bool, timeout: float = 90) -> dict:
    """Wait for a checkpoint inside ``epoch`` with a batch logged after it, then SIGKILL."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "state.pt").exists():
            try:
                state = torch.load(out / "state.pt")[0]
            except Exception:  # noqa: BLE001 - being replaced right now
                state = None
            entries = _log(out / "log-0-0.jsonl")
            if state and state["epoch"] == epoch and not state["finished"] and 2 <= state["delivered"] and any(
                    e["epoch"] == epoch and e["batch"] >= state["delivered"] for e in entries):
                break
        time.sleep(0.02)
    assert proc.poll() is None, f"the trainer ended before it could be killed: {proc.communicate()}"
    if group:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.kill()
    proc.communicate(timeout=30)
    return torch.load(out / "state.pt")


def _reference(root: Path, workers: int, epochs: int, world: int = 1, monkeypatch=None) -> list[list[int]]:
    """Per rank: the uninterrupted delivery order over ``epochs`` epochs (train_script's settings)."""
    per_rank = []
    for r in range(world):
        if world > 1:
            monkeypatch.setattr(readers.contract.env, "worker_env_hook", _hook(r, world))
        loader = make_loader(open_dataset(root, return_index=True, decode=False), batch_size=4, num_workers=workers,
                             seed=3)
        per_rank.append([i for _ in range(epochs) for i in flat(run_epoch(loader))])
        del loader
    if monkeypatch is not None:
        monkeypatch.undo()
    return per_rank


def _check_resumed(out: Path, states: dict, roots: list[Path], workers: int, ranks: int, monkeypatch) -> None:
    """For each dataset and rank: delivered before the checkpoint + after the restart == uninterrupted."""
    for k, root in enumerate(roots):
        refs = _reference(root, workers, epochs=2, world=ranks, monkeypatch=monkeypatch)
        for r in range(ranks):
            before = _before(_log(out / f"killed-{k}-{r}.jsonl"), states[k])
            after = flat(e["indices"] for e in _log(out / f"log-{k}-{r}.jsonl"))
            assert before + after == refs[r], (f"{root.name} rank {r}: killed at epoch {states[k]['epoch']} "
                                               f"batch {states[k]['delivered']}")


def _set_aside_logs(out: Path) -> None:
    for log in out.glob("log-*.jsonl"):
        log.rename(log.with_name("killed-" + log.name[4:]))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_sigkilled_trainer_resumes_exactly(packed41, workers, tmp_path, monkeypatch):
    """One trainer stepping a loader of every format together, SIGKILLed mid-epoch, restarted."""
    roots = [packed41[fmt] for fmt in FORMATS]
    cmd = [sys.executable, str(SCRIPT), str(tmp_path), *map(str, roots), "--workers", str(workers), "--every", "2"]
    proc = subprocess.Popen(cmd + ["--sleep", "0.15"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    states = _kill_when_checkpointed(proc, tmp_path, epoch=1, group=False)
    _set_aside_logs(tmp_path)
    res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(tmp_path, states, roots, workers, 1, monkeypatch)


@pytest.mark.slow
def test_sigkilled_ddp_job_resumes_exactly(packed41, tmp_path, monkeypatch):
    """2 ranks under torchrun (gloo), 2 workers per loader, a loader of every format stepped together;
    rank 0 saves the states; the whole job is SIGKILLed mid-epoch and started again."""
    roots = [packed41[fmt] for fmt in FORMATS]
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", str(SCRIPT),
            str(tmp_path), *map(str, roots), "--workers", "2", "--ddp"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(base + ["--sleep", "0.15"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    states = _kill_when_checkpointed(proc, tmp_path, epoch=1, group=True)
    _set_aside_logs(tmp_path)
    res = subprocess.run(base + ["--resume"], capture_output=True, text=True, timeout=180, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_resumed(tmp_path, states, roots, 2, 2, monkeypatch)
