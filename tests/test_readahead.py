"""packer.prepare.readahead.read_ahead: order, the byte bound, errors and early close; a gated Handoff."""

from __future__ import annotations

import threading
import time

import pytest

from packer.prepare.readahead import Handoff, outside_gil, read_ahead


def test_every_item_in_order_from_another_thread():
    threads = []

    def items():
        for i in range(1000):
            threads.append(threading.get_ident())
            yield i

    assert list(read_ahead(items(), lambda i: 1)) == list(range(1000))
    assert set(threads) == {threads[0]} and threads[0] != threading.get_ident()


def test_the_thread_runs_no_more_than_about_max_bytes_ahead():
    produced = []

    def items():
        for i in range(10_000):
            produced.append(i)
            yield b"x" * 1000

    it = read_ahead(items(), len, max_bytes=64_000, chunk_items=1000)
    next(it)
    time.sleep(0.5)  # ample time to run to the end if nothing held it back
    # 16 queued chunks of 4,000 bytes, one chunk in hand, one being filled: ~18 chunks of 4 items
    assert 16 * 4 <= len(produced) <= 20 * 4, len(produced)
    assert sum(1 for _ in it) == 9_999


def _wait_until(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_full_queue_is_refilled_only_once_half_of_it_is_taken():
    produced = []
    go = threading.Event()

    def items():
        for i in range(100):
            produced.append(i)
            yield i
            if i == 0:
                go.wait()  # the rest once item 0 has been taken: the queue is empty then

    # one item per chunk: 16 chunks queued and one in hand, then nothing until 8 are left
    it = read_ahead(items(), lambda i: 1, max_bytes=16, chunk_items=1)
    assert next(it) == 0
    go.set()
    assert _wait_until(lambda: len(produced) == 18)  # items 1-16 queued, 17 in hand
    for expected in range(1, 8):
        assert next(it) == expected
    time.sleep(0.3)  # ample time to refill if taking a chunk let it
    assert len(produced) == 18
    assert next(it) == 8  # 8 chunks left: the thread refills up to 16 again, one more in hand
    assert _wait_until(lambda: len(produced) == 26)
    time.sleep(0.3)
    assert len(produced) == 26
    assert list(it) == list(range(9, 100))


def test_an_error_comes_after_the_items_before_it():
    def items():
        yield from range(50)
        raise ValueError("source broke at 50")

    got = []
    with pytest.raises(ValueError, match="source broke at 50"):
        for i in read_ahead(items(), lambda i: 1, chunk_items=7):
            got.append(i)
    assert got == list(range(50))


def test_closing_early_stops_the_thread_and_closes_the_source():
    closed = threading.Event()

    def items():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    before = threading.active_count()
    it = read_ahead(items(), lambda i: 1, name="test-read-ahead")
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    it.close()
    assert closed.wait(5)
    deadline = time.monotonic() + 5
    while any(t.name == "test-read-ahead" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "test-read-ahead" for t in threading.enumerate())
    assert threading.active_count() == before


def test_a_producer_waiting_for_room_gives_up_when_the_consumer_is_gone():
    """The Writer's side: its caller puts into a full Handoff while the write thread dies; the put
    returns False (checked through ``alive``) instead of waiting for ever."""
    handoff: Handoff[int] = Handoff(max_bytes=16, chunk_items=1, depth=2)
    assert handoff.put(1, 1) and handoff.put(2, 1)  # two chunks: full
    gone = threading.Event()
    threading.Timer(0.3, gone.set).start()
    t0 = time.monotonic()
    assert handoff.put(3, 1, alive=lambda: not gone.is_set()) is False
    assert 0.25 < time.monotonic() - t0 < 5


def test_stop_lets_a_waiting_producer_go_and_refuses_what_comes_after():
    handoff: Handoff[int] = Handoff(max_bytes=16, chunk_items=1, depth=2)
    handoff.put(1, 1)
    handoff.put(2, 1)
    results: list[bool] = []
    producer = threading.Thread(target=lambda: results.append(handoff.put(3, 1)))
    producer.start()
    time.sleep(0.1)
    assert producer.is_alive(), "it waits for room"
    handoff.stop()
    producer.join(5)
    assert results == [False]
    assert handoff.put(4, 1) is False and handoff.end() is False


def test_items_put_are_taken_in_order_after_end_with_the_last_partial_chunk():
    handoff: Handoff[int] = Handoff(max_bytes=1 << 20, chunk_items=4)
    for i in range(10):
        assert handoff.put(i, 100)
    assert handoff.end()
    assert list(handoff.items()) == list(range(10))


def test_a_gated_producer_goes_on_only_while_the_consumer_is_outside_the_gil_or_short_of_items():
    h: Handoff[int] = Handoff(max_bytes=1 << 20, chunk_items=1, depth=16, gated_below=3)
    handed: list[int] = []

    def produce() -> None:
        for i in range(12):
            assert h.put(i, 1)
            handed.append(i)  # one item per chunk: handed over when put returns
        assert h.end()

    with h.consuming():
        producer = threading.Thread(target=produce)
        producer.start()
        assert _wait_until(lambda: len(handed) == 3)
        time.sleep(0.3)  # ample time to hand over more if nothing held it back
        assert len(handed) == 3  # 3 chunks wait: the gate is shut
        items = h.items()
        assert next(items) == 0  # 2 left, below the gate: the producer goes on until 3 wait again
        assert _wait_until(lambda: len(handed) == 4)
        time.sleep(0.3)
        assert len(handed) == 4
        with outside_gil():  # the consumer in a long GIL-free call: the rest goes over
            assert _wait_until(lambda: len(handed) == 12)
        producer.join(5)
        assert list(items) == list(range(1, 12))


def test_outside_gil_opens_only_the_gate_of_the_handoff_this_thread_consumes():
    h: Handoff[int] = Handoff(max_bytes=1 << 20, chunk_items=1, gated_below=1)
    handed: list[int] = []

    def produce() -> None:
        for i in range(3):
            if not h.put(i, 1):
                return
            handed.append(i)

    def elsewhere() -> None:
        with outside_gil():  # a thread that consumes no handoff (a pack's write thread)
            time.sleep(0.3)

    producer = threading.Thread(target=produce)
    producer.start()
    assert _wait_until(lambda: len(handed) == 1)  # one chunk waits: the gate is shut
    other = threading.Thread(target=elsewhere)
    with h.consuming():  # this thread's, not the other thread's
        other.start()
        other.join()
    elsewhere()  # and not here either, outside consuming()
    assert len(handed) == 1
    with h.consuming(), outside_gil():
        assert _wait_until(lambda: len(handed) == 3)
    producer.join(5)
    with pytest.raises(ValueError, match="gated_below=17"):
        Handoff(gated_below=17)
