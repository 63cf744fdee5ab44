#!/usr/bin/env python3
"""End-to-end throughput from Python: the spool package against what Python users pick today
for a persistent queue on one host, persist-queue's SQLite ack queue and RQ on Redis.

    bench/bench_python.sh [N] [--systems spool,persist-queue,rq] [--n-peer N] [--sync MODE]

The same workload for every system, one after another: one producer and two consumer
processes, 100-byte payloads each carrying its index (a lost message fails the run, one
delivered twice is counted), every message acked, msgs/s from the first send to the last ack.
How each system is set up, and why: docs/performance.md, "Python". A failed check or a
missing package exits 1; a target missed does not.
"""
from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

SYSTEMS = ("spool", "persist-queue", "rq")
PAD = b"x" * 92  # 8-byte index + 92 = 100 B
PEER_N = {"persist-queue": 20_000, "rq": 10_000}  # a run of 5-30 s on 2 cores
TIMEOUT = 900  # seconds one system's run may take before it is called failed


class CheckFailed(Exception):
    pass


def payload(i: int) -> bytes:
    return i.to_bytes(8, "big") + PAD


def index(p: bytes) -> int:
    return int.from_bytes(p[:8], "big")


@dataclass
class Result:
    system: str
    n: int
    seconds: float
    shares: list[int]  # acked per consumer
    duplicates: int
    note: str = ""

    @property
    def rate(self) -> float:
        return self.n / self.seconds


def run_processes(producer, consumer, args: tuple, n: int) -> tuple[float, list[int], int, int]:
    """Forks one producer and two consumers, starts them together, waits for both consumers'
    reports (acked, time of the last ack, seen-index counts, retries) and returns (seconds, shares,
    duplicates, retries).
    Raises CheckFailed if a process dies or a message is lost."""
    ctx = multiprocessing.get_context("fork")
    start, produced, done = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=producer, args=(*args, n, start, produced))]
    procs += [ctx.Process(target=consumer, args=(*args, n, start, produced, done)) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        time.sleep(0.5)  # all three have opened the queue and wait for start
        t0 = time.monotonic()
        start.set()
        results = []
        while len(results) < 2:
            try:
                results.append(done.get(timeout=1))
            except Exception:  # queue.Empty: see whether someone died or it takes too long
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise CheckFailed(f"a {'producer' if dead[0] is procs[0] else 'consumer'} "
                                      f"process exited with {dead[0].exitcode}")
                if time.monotonic() - t0 > TIMEOUT:
                    raise CheckFailed(f"not done after {TIMEOUT} s")
        for p in procs:
            p.join(timeout=30)
            if p.exitcode != 0:
                raise CheckFailed(f"a process exited with {p.exitcode}")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
    seconds = max(r[1] for r in results) - t0
    seen = [a + b for a, b in zip(results[0][2], results[1][2])]
    lost = seen.count(0)
    if lost:
        raise CheckFailed(f"{lost} of {n} messages never reached a consumer")
    return (seconds, [r[0] for r in results], sum(c - 1 for c in seen if c > 1),
            sum(r[3] for r in results))


# ---- spool ------------------------------------------------------------------------------------

def spool_producer(path, sync, n, start, produced):
    import spool
    with spool.Queue(path) as q:
        start.wait()
        for i in range(0, n, 100):
            q.send_batch([payload(j) for j in range(i, min(n, i + 100))])
    produced.set()


def spool_consumer(path, sync, n, start, produced, done):
    import spool
    seen, acked, last_ack = bytearray(n), 0, 0.0
    with spool.Queue(path) as q:
        start.wait()
        while True:
            msgs = q.receive(max=64, wait=0.2)
            if not msgs:
                if q.stats().acked_total >= n:
                    break
                continue
            for m in msgs:
                m.ack()
                seen[index(m.payload)] += 1
            acked += len(msgs)
            last_ack = time.monotonic()
    done.put((acked, last_ack, bytes(seen), 0))


def run_spool(tmp: str, n: int, sync: str) -> Result:
    import spool
    path = os.path.join(tmp, "spool-q")
    spool.Queue.create(path, sync=sync).close()
    seconds, shares, dups, _ = run_processes(spool_producer, spool_consumer, (path, sync), n)
    with spool.Queue(path) as q:
        st = q.stats()
    if st.acked_total != n or st.ready or st.in_flight or st.delayed or st.dead:
        raise CheckFailed(f"spool: afterwards acked_total {st.acked_total} of {n}, ready {st.ready}, "
                          f"in_flight {st.in_flight}, delayed {st.delayed}, dead {st.dead}")
    return Result("spool", n, seconds, shares, dups, f"sync={sync}, send_batch 100, receive 64")


# ---- persist-queue ------------------------------------------------------------------------------

PQ_SYNCHRONOUS = {"always": "FULL", "interval": "NORMAL", "never": "OFF"}


def pq_open(path: str, sync: str):
    import persistqueue
    q = persistqueue.SQLiteAckQueue(path, auto_resume=False)
    q._putter.execute(f"PRAGMA synchronous={PQ_SYNCHRONOUS[sync]}")  # its only connection
    return q


def pq_retry(counter: list[int], call, *args, **kwargs):
    """Calls call until it does not fail with SQLITE_BUSY ("database is locked"), which
    persist-queue's get() and ack() raise at once when two processes race for the write lock
    after reading."""
    while True:
        try:
            return call(*args, **kwargs)
        except sqlite3.OperationalError as e:
            if "locked" not in str(e):
                raise
            counter[0] += 1


def pq_producer(path, sync, n, start, produced):
    retries = [0]
    q = pq_open(path, sync)
    start.wait()
    for i in range(n):
        pq_retry(retries, q.put, payload(i))
    produced.set()


def pq_consumer(path, sync, n, start, produced, done):
    from persistqueue.exceptions import Empty
    retries = [0]
    seen, acked, last_ack = bytearray(n), 0, 0.0
    q = pq_open(path, sync)
    start.wait()
    while True:
        finished = produced.is_set()  # before the get: an Empty after it means none is left
        try:
            item = pq_retry(retries, q.get, block=True, timeout=0.01)
        except Empty:
            if finished:
                break
            continue
        pq_retry(retries, q.ack, item)
        last_ack = time.monotonic()
        seen[index(item)] += 1
        acked += 1
        if acked % 500 == 0:
            pq_retry(retries, q.clear_acked_data)
    done.put((acked, last_ack, bytes(seen), retries[0]))


def run_persist_queue(tmp: str, n: int, sync: str) -> Result:
    if importlib.util.find_spec("persistqueue") is None:
        raise CheckFailed("persist-queue is not installed for this Python: apt-get install "
                          "python3-persist-queue and run with /usr/bin/python3 (bench/bench_python.sh does)")
    path = os.path.join(tmp, "persist-queue")
    pq_open(path, sync)
    seconds, shares, dups, retries = run_processes(pq_producer, pq_consumer, (path, sync), n)
    q = pq_open(path, sync)
    # Rows are only deleted by clear_acked_data(), which deletes acked ones: so all n were
    # acked if all n were inserted and no row is left in another state.
    table = q._table_name
    db = sqlite3.connect(os.path.join(path, q.db_file_name))
    inserted = db.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table.strip("`"),)).fetchone()
    not_acked = db.execute(f"SELECT COUNT(*) FROM {table} WHERE status != 5").fetchone()[0]
    db.close()
    if not inserted or inserted[0] != n or not_acked:
        raise CheckFailed(f"persist-queue: afterwards {inserted} rows inserted of {n}, {not_acked} not acked")
    return Result("persist-queue", n, seconds, shares, dups,
                  f"SQLiteAckQueue, synchronous={PQ_SYNCHRONOUS[sync]}, one put per message; "
                  f"{retries} consumer calls retried on 'database is locked'")


# ---- RQ on Redis --------------------------------------------------------------------------------

_rq_seen = bytearray()  # the consumer's count per index, filled by rq_job in that process


def rq_job(p: bytes) -> None:
    """The job: marks its payload seen (in the SimpleWorker's own process)."""
    _rq_seen[index(p)] += 1


def rq_producer(port, sync, n, start, produced):
    import redis
    import rq
    q = rq.Queue("bench", connection=redis.Redis(port=port))
    start.wait()
    for i in range(0, n, 100):
        q.enqueue_many([rq.Queue.prepare_data(rq_job, (payload(j),), result_ttl=0)
                        for j in range(i, min(n, i + 100))])
    produced.set()


def rq_consumer(port, sync, n, start, produced, done):
    import redis
    import rq
    global _rq_seen
    _rq_seen = bytearray(n)
    conn = redis.Redis(port=port)
    q = rq.Queue("bench", connection=conn)
    acked, last_ack = 0, 0.0
    start.wait()
    while True:
        finished = produced.is_set()  # before the work: the burst then empties the queue
        # A burst worker returns when the queue is empty; its successful_job_count stays in
        # its Redis hash (each worker has a new name) for a minute after.
        w = rq.SimpleWorker([q], connection=conn)
        w.work(burst=True, logging_level="WARNING")
        done_jobs = int(conn.hget(w.key, "successful_job_count") or 0)
        if done_jobs:  # the worker's last job was acked just before work() returned
            acked += done_jobs
            last_ack = time.monotonic()
        if finished:
            break
        time.sleep(0.002)
    done.put((acked, last_ack, bytes(_rq_seen), 0))


REDIS_FSYNC = {"always": "always", "interval": "everysec", "never": ""}  # "": no AOF


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp: str, sync: str) -> tuple[subprocess.Popen, int]:
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.access(exe, os.X_OK):
        raise CheckFailed("redis-server is not installed: apt-get install redis-server")
    data = os.path.join(tmp, "redis-data")
    os.mkdir(data)
    port = free_port()
    fsync = REDIS_FSYNC[sync]
    aof = ["--appendonly", "yes", "--appendfsync", fsync] if fsync else ["--appendonly", "no"]
    server = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--dir", data,
                               "--save", "", "--daemonize", "no", "--protected-mode", "yes",
                               "--logfile", os.path.join(tmp, "redis.log"), *aof])
    for _ in range(200):
        if server.poll() is not None:
            raise CheckFailed(f"redis-server exited at start ({server.returncode}); see its log")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return server, port
        except OSError:
            time.sleep(0.05)
    stop(server)
    raise CheckFailed(f"redis-server did not listen on {port}")


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_rq(tmp: str, n: int, sync: str) -> Result:
    try:
        import redis
        import rq
        from rq.registry import FailedJobRegistry, StartedJobRegistry
    except ImportError:
        raise CheckFailed("RQ is not installed for this Python: apt-get install python3-rq "
                          "python3-redis and run with /usr/bin/python3 (bench/bench_python.sh does)")
    server, port = start_redis(tmp, sync)
    try:
        seconds, shares, dups, _ = run_processes(rq_producer, rq_consumer, (port, sync), n)
        conn = redis.Redis(port=port)
        q = rq.Queue("bench", connection=conn)
        left = {"queued": q.count, "started": StartedJobRegistry(queue=q).count,
                "failed": FailedJobRegistry(queue=q).count}
        if sum(shares) != n or any(left.values()):
            raise CheckFailed(f"rq: afterwards {sum(shares)} of {n} jobs finished; left {left}")
    finally:
        stop(server)
    fsync = f"appendfsync {REDIS_FSYNC[sync]}" if REDIS_FSYNC[sync] else "no AOF"
    return Result("rq", n, seconds, shares, dups,
                  f"SimpleWorker, enqueue_many 100, redis-server {fsync}")


RUNNERS = {"spool": run_spool, "persist-queue": run_persist_queue, "rq": run_rq}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=200_000, help="messages for spool (200,000)")
    ap.add_argument("--n-peer", type=int,
                    help="messages for persist-queue and rq (default 20,000 and 10,000)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="comma-separated subset of " + ",".join(SYSTEMS))
    ap.add_argument("--sync", default="interval", choices=["always", "interval", "never"])
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        ap.error(f"unknown system {unknown}; choose from {','.join(SYSTEMS)}")
    # A kill of this process ends it through the finally blocks that stop redis-server and
    # the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    base = "/var/tmp" if os.path.isdir("/var/tmp") else None  # a disk, as bench/compare uses
    results: list[Result] = []
    failed = False
    print(f"{os.cpu_count()} cores, load {' '.join(open('/proc/loadavg').read().split()[:3])}; "
          f"1 producer + 2 consumer processes, 100 B, sync={args.sync}", flush=True)
    for name in systems:
        with tempfile.TemporaryDirectory(prefix="spool-bench-py.", dir=base) as tmp:
            n = args.n if name == "spool" else args.n_peer or PEER_N[name]
            try:
                r = RUNNERS[name](tmp, n, args.sync)
            except CheckFailed as e:
                print(f"{name:<14} FAILED: {e}", flush=True)
                failed = True
                continue
        results.append(r)
        print(f"{name:<14} {r.rate:>9,.0f} msgs/s  n={n:,} in {r.seconds:.2f} s; acked per consumer "
              f"{r.shares[0]:,} / {r.shares[1]:,}; duplicates {r.duplicates}; {r.note}", flush=True)

    by_name = {r.system: r for r in results}
    peers = [r for r in results if r.system != "spool"]
    if "spool" in by_name:
        rate = by_name["spool"].rate
        if peers:
            best = max(peers, key=lambda r: r.rate)
            ratio = rate / best.rate
            print(f"spool / faster peer ({best.system}): {ratio:.1f}x; "
                  f"target >= 10x: {'PASS' if ratio >= 10 else 'MISS'}")
        print(f"spool from Python: {rate:,.0f} msgs/s; target >= 100,000: "
              f"{'PASS' if rate >= 100_000 else 'MISS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
