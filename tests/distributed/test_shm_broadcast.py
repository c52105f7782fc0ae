"""The shared-memory broadcast ring: order, wrap-around with a lagging reader, oversize messages
over ZeroMQ, timeouts, and a dead reader noticed by the writer."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pagedlm.distributed.shm_broadcast import BroadcastReader, BroadcastWriter, Timeout


def _read_all(reader: BroadcastReader, count: int, out: list) -> None:
    out.extend(reader.dequeue(timeout=20.0) for _ in range(count))
    reader.close()


def test_every_reader_gets_every_message_in_order_past_the_ring_and_chunk_size() -> None:
    writer = BroadcastWriter(num_readers=2, num_chunks=4, chunk_bytes=256)
    messages = [("step", i, np.full(i % 7, i)) for i in range(40)]
    messages[5] = ("big", np.arange(1000))  # 8 kB: over a chunk, goes over ZeroMQ
    messages[6] = ("big", np.arange(2000))  # two oversize in a row keep their order
    received: list[list] = [[], []]
    readers = [BroadcastReader(writer.handle, i) for i in range(2)]
    threads = [
        threading.Thread(target=_read_all, args=(readers[i], len(messages), received[i]))
        for i in range(2)
    ]
    threads[0].start()  # reader 1 starts late: the writer must wait for it, not overwrite
    for message in messages[:4]:
        writer.enqueue(message)
    threads[1].start()
    for message in messages[4:]:
        writer.enqueue(message)
    for thread in threads:
        thread.join(30)
    writer.close()
    for got in received:
        assert len(got) == len(messages)
        for sent, came in zip(messages, got, strict=True):
            assert sent[0] == came[0] and sent[1:-1] == came[1:-1]
            np.testing.assert_array_equal(sent[-1], came[-1])


def test_reader_timeout_and_writer_sees_a_dead_reader() -> None:
    writer = BroadcastWriter(num_readers=1, num_chunks=2, chunk_bytes=64)
    reader = BroadcastReader(writer.handle, 0)
    with pytest.raises(Timeout):
        reader.dequeue(timeout=0.01)
    writer.enqueue("a")
    writer.enqueue("b")  # the ring is full now; the reader never reads again

    def reader_dead() -> None:
        raise RuntimeError("reader gone")

    with pytest.raises(RuntimeError, match="reader gone"):
        writer.enqueue("c", alive=reader_dead)
    assert reader.dequeue(timeout=1.0) == "a"
    reader.close()
    writer.close()


def test_enqueue_each_gives_each_reader_its_own_message_in_order() -> None:
    writer = BroadcastWriter(num_readers=2, num_chunks=2, chunk_bytes=256)
    readers = [BroadcastReader(writer.handle, i) for i in range(2)]
    received: list[list] = [[], []]
    threads = [
        threading.Thread(target=_read_all, args=(readers[i], 6, received[i])) for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for i in range(3):  # past the ring of 2: shared and per-reader messages alternate
        writer.enqueue(("all", i))
        writer.enqueue_each([("reader", 0, np.zeros(10 * (i + 1))), ("reader", 1, i)])
    for thread in threads:
        thread.join(30)
    sizes = list(writer.sent_bytes)
    writer.close()
    for reader, got in enumerate(received):
        assert [m[0] for m in got] == ["all", "reader"] * 3
        assert [m[1] for m in got[1::2]] == [reader] * 3
    assert [len(m[2]) for m in received[0][1::2]] == [10, 20, 30]
    assert [m[2] for m in received[1][1::2]] == [0, 1, 2]
    assert sizes[0] > sizes[1] + 3 * 8 * 10  # reader 1 never received reader 0's arrays


def test_unread_counts_each_readers_lag_and_a_full_ring_times_out() -> None:
    writer = BroadcastWriter(num_readers=2, num_chunks=3, chunk_bytes=64)
    readers = [BroadcastReader(writer.handle, r) for r in range(2)]
    try:
        assert [writer.unread(r) for r in range(2)] == [0, 0]
        for i in range(3):
            writer.enqueue(i)
        assert [readers[0].dequeue(0.5) for _ in range(3)] == [0, 1, 2]
        assert readers[1].dequeue(0.5) == 0
        assert [writer.unread(r) for r in range(2)] == [0, 2]
        writer.enqueue(3)  # the chunk both read
        assert [writer.unread(r) for r in range(2)] == [1, 3]
        with pytest.raises(Timeout):  # reader 1 holds every other chunk
            writer.enqueue(4, timeout=0.05)
    finally:
        for reader in readers:
            reader.close()
        writer.close()
