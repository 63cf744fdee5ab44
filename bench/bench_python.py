#!/usr/bin/env python3
"""End-to-end throughput of the spool Python package (issue 25): one producer process and
two consumer processes on one queue, 100-byte payloads, every message received and acked.
Prints msgs/s from the first send to the last ack.

    SPOOL_LIBRARY=build/libspool.so.0 PYTHONPATH=python python3 bench/bench_python.py [N] [--sync MODE]

The producer sends in batches of 100 (send_batch); each consumer receives up to 64 at a time
and acks each message on its own (one ack call per message, as a worker would).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time

import spool


def producer(path: str, n: int, start) -> None:
    payload = b"x" * 100
    start.wait()
    with spool.Queue(path) as q:
        for i in range(0, n, 100):
            q.send_batch([payload] * min(100, n - i))


def consumer(path: str, n: int, start, done) -> None:
    acked = 0
    start.wait()
    with spool.Queue(path) as q:
        while True:
            msgs = q.receive(max=64, wait=0.2)
            if not msgs:
                if q.stats().acked_total >= n:
                    break
                continue
            for m in msgs:
                m.ack()
            acked += len(msgs)
    done.put((acked, time.monotonic()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="?", default=200_000)
    ap.add_argument("--sync", default="interval", choices=["always", "interval", "never"])
    args = ap.parse_args()
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="spool-bench-py.") as tmp:
        path = os.path.join(tmp, "q")
        spool.Queue(path, sync=args.sync).close()
        start, done = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=producer, args=(path, args.n, start))]
        procs += [ctx.Process(target=consumer, args=(path, args.n, start, done)) for _ in range(2)]
        for p in procs:
            p.start()
        time.sleep(0.3)  # all three attached and waiting
        t0 = time.monotonic()
        start.set()
        results = [done.get(timeout=600) for _ in range(2)]
        for p in procs:
            p.join()
        elapsed = max(t for _, t in results) - t0
        acked = sum(a for a, _ in results)
        with spool.Queue(path) as q:
            st = q.stats()
        assert acked == args.n and st.acked_total == args.n, (acked, st)
        print(f"spool (Python, sync={args.sync}): {args.n} msgs of 100 B, 1 producer + 2 consumers: "
              f"{args.n / elapsed:,.0f} msgs/s end to end ({elapsed:.2f} s; consumer shares "
              f"{results[0][0]} / {results[1][0]})")


if __name__ == "__main__":
    main()
