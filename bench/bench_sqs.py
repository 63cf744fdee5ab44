#!/usr/bin/env python3
"""Messages per second through the SQS face (spool-serve, docs/sqs.md) with the batch actions,
against the same work through the library (spool's Python package on libspool), in one run.

Each system: one client sends N messages of 100 B in batches of 10 (SendMessageBatch /
send_batch), then receives them 10 at a time and deletes each batch (ReceiveMessage +
DeleteMessageBatch / receive(10) + ack). Prints msgs/s for each phase and the library's
throughput over the face's, and how busy the server was (its CPU time over the run's wall time).

Usage: python3 bench/bench_sqs.py [--build DIR] [--n N] [--clients C]
  --build DIR  meson build directory with tools/spool-serve and libspool.so.0 (default: build)
  --clients C  concurrent boto3 clients for the SQS face (default 1; the library uses C threads)"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_parallel(clients, fn):
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def bench_sqs(build, n, clients, tmp):
    import boto3
    import botocore.config
    root = os.path.join(tmp, "sqs")
    os.mkdir(root)
    creds = os.path.join(tmp, "credentials")
    with open(creds, "w") as f:
        f.write("[default]\naws_access_key_id = AKIDBENCH\naws_secret_access_key = bench\n")
    port = free_port()
    srv = subprocess.Popen([os.path.join(build, "tools", "spool-serve"), root, "--sqs", f"127.0.0.1:{port}",
                            "--credentials", creds])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        mk = lambda: boto3.client("sqs", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                                  aws_access_key_id="AKIDBENCH", aws_secret_access_key="bench",
                                  config=botocore.config.Config(max_pool_connections=4))
        cl = [mk() for _ in range(clients)]
        url = cl[0].create_queue(QueueName="bench")["QueueUrl"]
        body = "x" * 100
        per = n // clients

        def send(i):
            for k in range(0, per, 10):
                cl[i].send_message_batch(QueueUrl=url, Entries=[{"Id": str(j), "MessageBody": body} for j in range(10)])

        def drain(i):
            got = 0
            while got < per:
                ms = cl[i].receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
                if not ms:
                    continue
                cl[i].delete_message_batch(QueueUrl=url, Entries=[{"Id": str(j), "ReceiptHandle": m["ReceiptHandle"]}
                                                                   for j, m in enumerate(ms)])
                got += len(ms)
        t_send = run_parallel(clients, send)
        t_drain = run_parallel(clients, drain)
        with open(f"/proc/{srv.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        server_cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return per * clients / t_send, per * clients / t_drain, server_cpu / (t_send + t_drain)
    finally:
        srv.terminate()
        srv.wait(timeout=10)


def bench_library(build, n, clients, tmp):
    os.environ.setdefault("SPOOL_LIBRARY", os.path.join(build, "libspool.so.0"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import spool
    q = spool.Queue.create(os.path.join(tmp, "lib"))
    body = b"x" * 100
    per = n // clients

    def send(i):
        for k in range(0, per, 10):
            q.send_batch([body] * 10)

    def drain(i):
        got = 0
        while got < per:
            ms = q.receive(10, wait=1.0)
            for m in ms:
                q.ack(m.receipt)
            got += len(ms)
    return per * clients / run_parallel(clients, send), per * clients / run_parallel(clients, drain)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--clients", type=int, default=1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s_send, s_recv, s_cpu = bench_sqs(a.build, a.n, a.clients, tmp)
        l_send, l_recv = bench_library(a.build, a.n, a.clients, tmp)
    print(f"{a.n} messages of 100 B, batches of 10, {a.clients} client(s)")
    print(f"  SQS face (boto3): send {s_send:10,.0f} msgs/s   receive+delete {s_recv:10,.0f} msgs/s")
    print(f"  library (Python): send {l_send:10,.0f} msgs/s   receive+ack    {l_recv:10,.0f} msgs/s")
    print(f"  library / face:   send {l_send / s_send:9.1f}x        receive+delete {l_recv / s_recv:9.1f}x")
    print(f"  spool-serve used {s_cpu:.0%} of a core while the face ran (the rest is the clients: boto3's signing,")
    print("  request building and XML parsing, in Python)")


if __name__ == "__main__":
    main()
