#!/usr/bin/env python3
"""A plain SQS worker, written against boto3 only: it runs unchanged against Amazon SQS or
against spool's SQS face (docs/sqs.md). It long-polls QUEUE, handles each message, and
deletes it once handled; a message it fails on comes back after its visibility timeout (and
goes to the dead-letter queue after the RedrivePolicy's maxReceiveCount).

  spool serve /var/spool/sqs --sqs 127.0.0.1:9324 --credentials ~/.aws/credentials &
  SQS_ENDPOINT=http://127.0.0.1:9324 python3 sqs_worker.py jobs [--max N]

The endpoint and keys come from the usual places (AWS_* variables, ~/.aws/credentials);
SQS_ENDPOINT, when set, points boto3 at a server other than AWS."""
import argparse
import os
import sys

import boto3


def handle(body, attributes):
    """The work: here, print the message. Raise to have it retried."""
    kind = attributes.get("kind", {}).get("StringValue", "-")
    print(f"{kind}: {body}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("queue")
    ap.add_argument("--max", type=int, default=0, help="stop after N messages (0: run forever)")
    ap.add_argument("--idle-exit", type=int, default=0, help="stop after N empty 20 s polls (0: never)")
    args = ap.parse_args()
    sqs = boto3.client("sqs", endpoint_url=os.environ.get("SQS_ENDPOINT") or None)
    url = sqs.get_queue_url(QueueName=args.queue)["QueueUrl"]
    done = idle = 0
    while not args.max or done < args.max:
        r = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=20,
                                MessageAttributeNames=["All"])
        msgs = r.get("Messages", [])
        if not msgs:
            idle += 1
            if args.idle_exit and idle >= args.idle_exit:
                break
            continue
        idle = 0
        for m in msgs:
            try:
                handle(m["Body"], m.get("MessageAttributes", {}))
            except Exception as e:  # left in the queue: it comes back after its visibility timeout
                print(f"failed: {e}", file=sys.stderr)
                continue
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            done += 1
            if args.max and done >= args.max:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
