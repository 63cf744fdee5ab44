#!/usr/bin/env python3
"""The SQS face with a real, unchanged client: Debian's boto3 (query protocol) against
spool-serve started here on 127.0.0.1 with a free port. Usage: sqs_boto3_test.py SPOOL_SERVE"""
import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import boto3
    import botocore.config
    from botocore.exceptions import ClientError
except ImportError:
    print("SKIP: python3-boto3 is not installed (scripts/deps.sh --test installs it)", file=sys.stderr)
    sys.exit(77)

SERVE = sys.argv.pop(1) if len(sys.argv) > 1 else "build/tools/spool-serve"
SPOOL = sys.argv.pop(1) if len(sys.argv) > 1 else "build/tools/spool"
KEY, SECRET = "AKIDSPOOLTEST", "s3cr3t/spool+test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_words(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split()


def attributes_md5(attrs):
    """SQS's MD5OfMessageAttributes, written from its documentation."""
    buf = b""
    for name in sorted(attrs):
        a = attrs[name]
        t = a["DataType"]
        buf += struct.pack(">I", len(name)) + name.encode() + struct.pack(">I", len(t)) + t.encode()
        if "BinaryValue" in a:
            buf += b"\x02" + struct.pack(">I", len(a["BinaryValue"])) + a["BinaryValue"]
        else:
            v = a["StringValue"].encode()
            buf += b"\x01" + struct.pack(">I", len(v)) + v
    return hashlib.md5(buf).hexdigest()


class Server:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.proc = None
        self.root = os.path.join(self.tmp.name, "root")
        os.mkdir(self.root)
        self.creds = os.path.join(self.tmp.name, "credentials")
        with open(self.creds, "w") as f:
            f.write(f"[default]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self):
        self.proc = subprocess.Popen([SERVE, self.root, "--sqs", f"127.0.0.1:{self.port}", "--credentials", self.creds])
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("spool-serve did not start listening")

    def client(self, key=KEY, secret=SECRET):
        return boto3.client("sqs", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id=key,
                            aws_secret_access_key=secret,
                            config=botocore.config.Config(retries={"max_attempts": 1}, read_timeout=30))

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.tmp.cleanup()


def setUpModule():
    global SRV, SQS
    SRV = Server()
    SQS = SRV.client()


def tearDownModule():
    SRV.close()


def code(e):
    return e.exception.response["Error"]["Code"]


class QueueActions(unittest.TestCase):
    def test_create_get_list_attributes_purge_delete(self):
        url = SQS.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "45", "DelaySeconds": "0",
                                                             "MaximumMessageSize": "4096",
                                                             "ReceiveMessageWaitTimeSeconds": "0",
                                                             "MessageRetentionPeriod": "3600"})["QueueUrl"]
        self.assertTrue(url.endswith("/jobs"))
        self.assertTrue(os.path.exists(os.path.join(SRV.root, "jobs", "spool.conf")), "the queue is ROOT/NAME")
        self.assertEqual(SQS.get_queue_url(QueueName="jobs")["QueueUrl"], url)
        # Same attributes: the same queue; different ones: QueueAlreadyExists.
        self.assertEqual(SQS.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "45"})["QueueUrl"], url)
        with self.assertRaises(ClientError) as e:
            SQS.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "46"})
        self.assertEqual(code(e), "QueueAlreadyExists")
        self.assertIn(url, SQS.list_queues(QueueNamePrefix="jo")["QueueUrls"])
        self.assertNotIn("QueueUrls", SQS.list_queues(QueueNamePrefix="zz"))
        SQS.send_message(QueueUrl=url, MessageBody="one")
        a = SQS.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        self.assertEqual(a["VisibilityTimeout"], "45")
        self.assertEqual(a["MaximumMessageSize"], "4096")
        self.assertEqual(a["MessageRetentionPeriod"], "3600")
        self.assertEqual(a["ApproximateNumberOfMessages"], "1")
        self.assertEqual(a["QueueArn"], "arn:aws:sqs:us-east-1:000000000000:jobs")
        SQS.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "5", "ReceiveMessageWaitTimeSeconds": "1"})
        a = SQS.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds", "ReceiveMessageWaitTimeSeconds"])
        self.assertEqual(a["Attributes"], {"DelaySeconds": "5", "ReceiveMessageWaitTimeSeconds": "1"})
        with self.assertRaises(ClientError) as e:  # fixed in spool.conf at creation
            SQS.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "10"})
        self.assertEqual(code(e), "InvalidAttributeValue")
        with self.assertRaises(ClientError) as e:
            SQS.get_queue_attributes(QueueUrl=url, AttributeNames=["Bogus"])
        self.assertEqual(code(e), "InvalidAttributeName")
        SQS.purge_queue(QueueUrl=url)
        self.assertEqual(SQS.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
                         ["Attributes"]["ApproximateNumberOfMessages"], "0")
        SQS.delete_queue(QueueUrl=url)
        self.assertFalse(os.path.exists(os.path.join(SRV.root, "jobs")))
        with self.assertRaises(ClientError) as e:
            SQS.get_queue_url(QueueName="jobs")
        self.assertEqual(code(e), "AWS.SimpleQueueService.NonExistentQueue")

    def test_bad_names(self):
        for bad in ["a/b", "..", "a.b", "x" * 81, "plain.fifo"]:
            with self.assertRaises(ClientError) as e:
                SQS.create_queue(QueueName=bad)
            self.assertEqual(code(e), "InvalidParameterValue", bad)


class Messages(unittest.TestCase):
    def setUp(self):
        self.url = SQS.create_queue(QueueName="msgs")["QueueUrl"]
        SQS.purge_queue(QueueUrl=self.url)

    def test_attributes_of_every_type_and_md5(self):
        attrs = {"s": {"DataType": "String", "StringValue": "héllo <&>"},
                 "n": {"DataType": "Number", "StringValue": "-12.5"},
                 "b": {"DataType": "Binary", "BinaryValue": bytes(range(256))},
                 "c.custom": {"DataType": "Number.int", "StringValue": "7"}}
        body = "body with <xml> & ünïcode\r\nand a CR"
        r = SQS.send_message(QueueUrl=self.url, MessageBody=body, MessageAttributes=attrs)
        self.assertEqual(r["MD5OfMessageBody"], hashlib.md5(body.encode()).hexdigest())
        self.assertEqual(r["MD5OfMessageAttributes"], attributes_md5(attrs))
        m = SQS.receive_message(QueueUrl=self.url, MessageAttributeNames=["All"], AttributeNames=["All"])["Messages"][0]
        self.assertEqual(m["Body"], body)
        self.assertEqual(m["MessageId"], r["MessageId"])
        self.assertEqual(m["MessageAttributes"], attrs)
        self.assertEqual(m["MD5OfMessageAttributes"], attributes_md5(attrs))
        self.assertEqual(m["MD5OfBody"], hashlib.md5(body.encode()).hexdigest())
        self.assertEqual(m["Attributes"]["ApproximateReceiveCount"], "1")
        self.assertLess(abs(int(m["Attributes"]["SentTimestamp"]) - time.time() * 1000), 60000)
        self.assertIn("ApproximateFirstReceiveTimestamp", m["Attributes"])
        SQS.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])
        # Filtering: only the names asked for, and the MD5 of those.
        SQS.send_message(QueueUrl=self.url, MessageBody="x", MessageAttributes=attrs)
        m = SQS.receive_message(QueueUrl=self.url, MessageAttributeNames=["s", "c.*"])["Messages"][0]
        self.assertEqual(set(m["MessageAttributes"]), {"s", "c.custom"})
        self.assertNotIn("Attributes", m)
        SQS.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])

    def test_batches(self):
        r = SQS.send_message_batch(QueueUrl=self.url, Entries=[{"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(10)]
                                   + [])
        self.assertEqual(len(r["Successful"]), 10)
        got = []
        while len(got) < 10:
            ms = SQS.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10).get("Messages", [])
            self.assertTrue(ms)
            got += ms
        self.assertEqual(sorted(m["Body"] for m in got), sorted(f"m{i}" for i in range(10)))
        r = SQS.change_message_visibility_batch(QueueUrl=self.url, Entries=[
            {"Id": "a", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "bad", "ReceiptHandle": "not-a-receipt", "VisibilityTimeout": 5}])
        self.assertEqual([e["Id"] for e in r["Successful"]], ["a"])
        self.assertEqual(r["Failed"][0]["Code"], "ReceiptHandleIsInvalid")
        again = SQS.receive_message(QueueUrl=self.url, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
        self.assertEqual(again["Body"], got[0]["Body"])
        self.assertEqual(again["Attributes"]["ApproximateReceiveCount"], "2")
        self.assertNotEqual(again["ReceiptHandle"], got[0]["ReceiptHandle"], "a fresh receipt handle per receive")
        got[0] = again
        # Nine in one batch (one ack_batch) with a bad handle among them: it alone fails.
        r = SQS.delete_message_batch(QueueUrl=self.url, Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]}
                                                                 for i, m in enumerate(got[:9])] +
                                     [{"Id": "bad", "ReceiptHandle": "garbage"}])
        self.assertEqual(len(r["Successful"]), 9)
        self.assertEqual([(f["Id"], f["Code"]) for f in r["Failed"]], [("bad", "ReceiptHandleIsInvalid")])
        r = SQS.delete_message_batch(QueueUrl=self.url, Entries=[{"Id": "last", "ReceiptHandle": got[9]["ReceiptHandle"]}])
        self.assertEqual(len(r["Successful"]), 1)
        self.assertNotIn("Messages", SQS.receive_message(QueueUrl=self.url))
        with self.assertRaises(ClientError) as e:
            SQS.send_message_batch(QueueUrl=self.url, Entries=[{"Id": "x", "MessageBody": "1"}, {"Id": "x", "MessageBody": "2"}])
        self.assertEqual(code(e), "AWS.SimpleQueueService.BatchEntryIdsNotDistinct")

    def test_stale_receipt_deletes_successfully_and_keeps_the_message(self):
        SQS.send_message(QueueUrl=self.url, MessageBody="stale")
        first = SQS.receive_message(QueueUrl=self.url, VisibilityTimeout=1)["Messages"][0]
        time.sleep(1.2)
        second = SQS.receive_message(QueueUrl=self.url, VisibilityTimeout=30)["Messages"][0]
        SQS.delete_message(QueueUrl=self.url, ReceiptHandle=first["ReceiptHandle"])  # as SQS: success
        a = SQS.get_queue_attributes(QueueUrl=self.url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])
        self.assertEqual(a["Attributes"]["ApproximateNumberOfMessagesNotVisible"], "1", "the new lease still holds it")
        SQS.delete_message(QueueUrl=self.url, ReceiptHandle=second["ReceiptHandle"])
        with self.assertRaises(ClientError) as e:
            SQS.delete_message(QueueUrl=self.url, ReceiptHandle="garbage")
        self.assertEqual(code(e), "ReceiptHandleIsInvalid")

    def test_long_poll_wakes_on_send(self):
        out = {}

        def poll():
            t = time.monotonic()
            out["r"] = SQS.receive_message(QueueUrl=self.url, WaitTimeSeconds=10)
            out["t"] = time.monotonic() - t
        th = threading.Thread(target=poll)
        th.start()
        time.sleep(0.7)
        SRV.client().send_message(QueueUrl=self.url, MessageBody="wake")
        th.join(15)
        self.assertEqual(out["r"]["Messages"][0]["Body"], "wake")
        self.assertGreater(out["t"], 0.5, "it waited")
        self.assertLess(out["t"], 3, "woken by the send, not by the 10 s timeout")
        SQS.delete_message(QueueUrl=self.url, ReceiptHandle=out["r"]["Messages"][0]["ReceiptHandle"])
        t = time.monotonic()
        self.assertNotIn("Messages", SQS.receive_message(QueueUrl=self.url, WaitTimeSeconds=1))
        self.assertGreater(time.monotonic() - t, 0.9, "an empty long poll lasts its wait")


class Fifo(unittest.TestCase):
    def test_order_per_group_and_dedup(self):
        url = SQS.create_queue(QueueName="orders.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        sent = []
        for i in range(6):
            g = "a" if i % 2 == 0 else "b"
            r = SQS.send_message(QueueUrl=url, MessageBody=f"{g}{i}", MessageGroupId=g, MessageDeduplicationId=f"d{i}")
            sent.append(r)
        self.assertLess(sent[0]["SequenceNumber"], sent[1]["SequenceNumber"])
        dup = SQS.send_message(QueueUrl=url, MessageBody="again", MessageGroupId="a", MessageDeduplicationId="d0")
        self.assertEqual(dup["MessageId"], sent[0]["MessageId"], "a duplicate returns the first message's id")
        with self.assertRaises(ClientError) as e:
            SQS.send_message(QueueUrl=url, MessageBody="x")
        self.assertEqual(code(e), "MissingParameter")
        order = {"a": [], "b": []}
        for _ in range(20):
            ms = SQS.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]).get("Messages", [])
            for m in ms:
                order[m["Attributes"]["MessageGroupId"]].append(m["Body"])
                SQS.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            if len(order["a"]) + len(order["b"]) == 6:
                break
        self.assertEqual(order, {"a": ["a0", "a2", "a4"], "b": ["b1", "b3", "b5"]})
        cbd = SQS.create_queue(QueueName="cbd.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})
        r1 = SQS.send_message(QueueUrl=cbd["QueueUrl"], MessageBody="same", MessageGroupId="g")
        r2 = SQS.send_message(QueueUrl=cbd["QueueUrl"], MessageBody="same", MessageGroupId="g")
        self.assertEqual(r1["MessageId"], r2["MessageId"])


class Redrive(unittest.TestCase):
    def test_to_a_dead_letter_queue(self):
        dlq = SQS.create_queue(QueueName="failed")["QueueUrl"]
        arn = SQS.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        src = SQS.create_queue(QueueName="work", Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "2"})})["QueueUrl"]
        self.assertEqual(SQS.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"], [src])
        policy = json.loads(SQS.get_queue_attributes(QueueUrl=src, AttributeNames=["RedrivePolicy"])
                            ["Attributes"]["RedrivePolicy"])
        self.assertEqual(policy, {"deadLetterTargetArn": arn, "maxReceiveCount": 2})
        SQS.send_message(QueueUrl=src, MessageBody="poison", MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}})
        for n in (1, 2):
            # VisibilityTimeout=0 is spool's shortest lease, 1 ms: a receive that comes sooner
            # finds nothing, so each waits for it (it returns as soon as the lease ends).
            m = SQS.receive_message(QueueUrl=src, VisibilityTimeout=0, WaitTimeSeconds=2,
                                    AttributeNames=["ApproximateReceiveCount"])
            self.assertEqual(m["Messages"][0]["Attributes"]["ApproximateReceiveCount"], str(n))
        self.assertNotIn("Messages", SQS.receive_message(QueueUrl=src, WaitTimeSeconds=1))
        # spool dead-letters into work/dlq; the server moves it on into "failed" within 0.5 s.
        d = SQS.receive_message(QueueUrl=dlq, MessageAttributeNames=["All"], WaitTimeSeconds=5)["Messages"][0]
        self.assertEqual(d["Body"], "poison")
        self.assertEqual(d["MessageAttributes"], {"k": {"DataType": "String", "StringValue": "v"}})


class Example(unittest.TestCase):
    def test_the_boto3_worker_example_drains_a_queue(self):
        url = SQS.create_queue(QueueName="example")["QueueUrl"]
        SQS.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": f"job {i}", "MessageAttributes": {"kind": {"DataType": "String", "StringValue": "resize"}}}
            for i in range(3)])
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, SQS_ENDPOINT=SRV.url, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
                   AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null")
        out = subprocess.run([sys.executable, os.path.join(here, "..", "examples", "sqs_worker.py"), "example", "--max", "3"],
                             env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(sorted(out.stdout.splitlines()), ["resize: job 0", "resize: job 1", "resize: job 2"])
        a = SQS.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        self.assertEqual((a["ApproximateNumberOfMessages"], a["ApproximateNumberOfMessagesNotVisible"]), ("0", "0"))


class KillNine(unittest.TestCase):
    def test_an_sqs_worker_and_spool_work_drain_one_queue_across_a_kill_9_of_the_server(self):
        """Nothing is lost: every message sent is handled, by the boto3 worker or by `spool work`
        on the same queue; the only duplicates are the messages of the one batch the kill caught
        between receive and delete, which come back after their visibility timeout."""
        srv = Server()
        try:
            c = srv.client()
            url = c.create_queue(QueueName="both", Attributes={"VisibilityTimeout": "2"})["QueueUrl"]
            total = 200
            for k in range(0, total, 10):
                c.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{k + i}"} for i in range(10)])
            out = os.path.join(srv.tmp.name, "work.out")
            work = subprocess.Popen([SPOOL, "work", os.path.join(srv.root, "both"), "-j", "1", "--", "sh", "-c",
                                     f"sleep 0.02; cat >> {out}; echo >> {out}"])
            seen, killed, errors = [], False, 0
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                try:
                    if len(set(seen + read_words(out))) == total:
                        # Done once the queue is empty: the caught batch came back and was handled.
                        a = c.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
                        if a["ApproximateNumberOfMessages"] == a["ApproximateNumberOfMessagesNotVisible"] == "0":
                            break
                    ms = c.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
                    seen += [m["Body"] for m in ms]
                    if ms and not killed and len(seen) >= 30:
                        srv.proc.kill()  # kill -9 between this receive and its delete
                        srv.proc.wait()
                        killed = True
                        srv.start()
                        continue
                    if ms:
                        time.sleep(0.1)  # the work, so that spool work gets a share
                        c.delete_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                                                                      for i, m in enumerate(ms)])
                except Exception:  # the server restarting: try again
                    errors += 1
                    time.sleep(0.1)
            work.terminate()
            work.wait(timeout=10)
            by_work = read_words(out)
            print(f"kill -9: boto3 handled {len(seen)}, spool work {len(by_work)}, duplicates {len(seen) + len(by_work) - total}, "
                  f"{errors} failed calls while the server restarted", file=sys.stderr)
            handled = seen + by_work
            self.assertTrue(killed)
            self.assertEqual(set(handled), {f"m{i}" for i in range(total)}, "every message handled")
            self.assertTrue(by_work and len(seen) > 30, "both workers took part")
            self.assertLessEqual(len(handled) - total, 10, "duplicates only from the batch the kill caught")
            self.assertLess(time.monotonic(), deadline, "the queue was drained")
        finally:
            srv.close()


class Auth(unittest.TestCase):
    def test_wrong_secret_and_unknown_key_are_refused(self):
        with self.assertRaises(ClientError) as e:
            SRV.client(secret="wrong").list_queues()
        self.assertEqual(e.exception.response["ResponseMetadata"]["HTTPStatusCode"], 403)
        self.assertEqual(code(e), "SignatureDoesNotMatch")
        with self.assertRaises(ClientError) as e:
            SRV.client(key="AKIDNOBODY").list_queues()
        self.assertEqual(code(e), "InvalidClientTokenId")

    def test_a_presigned_url_is_accepted_and_an_altered_one_refused(self):
        import urllib.error
        import urllib.request
        from botocore.auth import SigV4QueryAuth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
        req = AWSRequest(method="GET", url=SRV.url + "/?Action=ListQueues&Version=2012-11-05&QueueNamePrefix=msgs")
        SigV4QueryAuth(Credentials(KEY, SECRET), "sqs", "us-east-1", expires=60).add_auth(req)
        url = req.prepare().url
        with urllib.request.urlopen(url, timeout=10) as r:
            self.assertIn(b"<ListQueuesResponse", r.read())
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url.replace("QueueNamePrefix=msgs", "QueueNamePrefix=other"), timeout=10)
        self.assertEqual(e.exception.code, 403)

    def test_unsigned_request_is_refused(self):
        import urllib.error
        import urllib.request
        req = urllib.request.Request(SRV.url + "/", data=b"Action=ListQueues",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(e.exception.code, 403)
        self.assertIn(b"MissingAuthenticationToken", e.exception.read())


if __name__ == "__main__":
    unittest.main(verbosity=2)
