"""The spool package against the real library, with real processes: competing workers
(multiprocessing), kill -9 of a worker holding a lease, stale acks, the C++ CLI as producer,
a C worker, Python and the CLI on one queue at once, and a long poll that leaves the GIL to
other threads."""
from __future__ import annotations

import collections
import ctypes
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import spool

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONPATH = os.path.join(HERE, "..")


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHONPATH + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_python(code: str, *args: str, **kw) -> subprocess.Popen:
    """Starts a real interpreter (this one) running `code`."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                            env=child_env(), **kw)


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------ basics and errors

def test_send_receive_ack_bytes_and_str(qdir):
    with spool.Queue.create(qdir, visibility=10) as q:
        before = time.time()
        a = q.send(b"\x00binary\xff")
        b = q.send("héllo")
        assert b == a + 1
        ids = q.send_batch(["x", b"y", "z"])
        assert ids == [b + 1, b + 2, b + 3]
        msgs = q.receive(max=10, wait=1)
        assert [m.id for m in msgs] == [a, b] + ids
        assert msgs[0].payload == b"\x00binary\xff"
        assert msgs[1].text == "héllo" and msgs[1].payload == "héllo".encode()
        assert all(m.receive_count == 1 for m in msgs)
        assert before - 1 <= msgs[0].enqueued <= time.time() + 1
        assert q.stats().in_flight == 5
        for m in msgs:
            m.ack()
        st = q.stats()
        assert (st.ready, st.in_flight, st.acked_total, st.sent_total) == (0, 0, 5, 5)
        assert q.receive() == []
        q.sync()
        assert q.durable_id >= ids[-1]


def test_ack_batch_acks_many_and_tells_each_receipts_outcome(qdir):
    with spool.Queue.create(qdir, visibility=60) as q:
        q.send_batch(["a", "b", "c", "d"])
        msgs = q.receive(max=3)
        assert len(msgs) == 3
        out = q.ack_batch([m.receipt for m in msgs[:2]] + ["garbage", msgs[0].receipt], sync=True)
        assert out[:2] == [None, None]
        assert isinstance(out[2], spool.InvalidArgument)
        assert isinstance(out[3], spool.NotFound)  # given twice: acked by the first
        assert q.ack_batch([]) == []
        st = q.stats()
        assert (st.acked_total, st.in_flight, st.ready) == (2, 1, 1)


def test_pause_resume_and_release_from_python(qdir):
    with spool.Queue.create(qdir, visibility=3600) as q:
        q.send("a")
        q.pause()
        assert q.stats().paused
        assert q.receive(wait=0.2) == []
        q.resume()
        assert not q.stats().paused
        [m] = q.receive()
        q.release(m.id)
        [again] = q.receive()
        assert again.id == m.id and again.receive_count == 2
        with pytest.raises(spool.Error):
            q.release(999)


def test_subscriptions_each_get_every_message_with_acks_of_their_own(qdir):
    """issue 46: Queue(path, subscription=name) reads one subscription of the queue's stream."""
    with spool.Queue.create(qdir, visibility=30) as q:
        assert q.subscriptions() == [] and q.subscription is None
        q.add_subscription("audit")
        first = q.send("one")
        q.add_subscription("replica", from_start=True)
        q.add_subscription("late")
        with spool.Queue(qdir, subscription="audit") as audit:
            assert audit.subscription == "audit" and "subscription='audit'" in repr(audit)
            [mine] = q.receive(wait=1)
            [theirs] = audit.receive(wait=1)
            assert mine.id == theirs.id == first and theirs.text == "one"
            # A receipt belongs to its reader: the other handle refuses it, naming why.
            with pytest.raises(spool.InvalidArgument, match="audit"):
                audit.ack(mine.receipt)
            with pytest.raises(spool.InvalidArgument):
                q.ack(theirs.receipt)
            theirs.ack()
            assert (audit.stats().in_flight, len(audit)) == (0, 0)
            assert q.stats().in_flight == 1  # the queue's own lease is untouched
            mine.ack()
            # The queue's own operations are refused on a subscription's handle.
            with pytest.raises(spool.InvalidArgument, match="subscription"):
                audit.purge()
            subs = {s.name: s for s in audit.subscriptions()}
            assert set(subs) == {"audit", "replica", "late"}
            assert subs["replica"] == spool.Subscription("replica", subs["replica"].from_id, 1, 0)
            assert subs["replica"].from_id <= first < subs["late"].from_id
            assert (subs["audit"].messages, subs["late"].messages) == (0, 0)
            with spool.Queue(qdir, subscription="replica") as replica:
                m = replica.receive_id(first)  # by id, in the subscription only
                assert m.id == first and m.text == "one" and m.receive_count == 1
                with pytest.raises(spool.Empty):
                    replica.receive_id(first)  # leased there now
                leased = {s.name: s.in_flight for s in replica.subscriptions()}
                assert leased == {"audit": 0, "replica": 1, "late": 0}
            q.remove_subscription("audit")
            with pytest.raises(spool.NotFound, match="audit"):
                audit.receive()
        assert sorted(s.name for s in q.subscriptions()) == ["late", "replica"]
        # Bad names and unknown ones, each refused with the name.
        with pytest.raises(spool.NotFound, match="nosuch"):
            spool.Queue(qdir, subscription="nosuch")
        for bad in ("", "default", "a/b", "x" * 49):
            with pytest.raises(spool.InvalidArgument):
                q.add_subscription(bad)
        with pytest.raises(spool.InvalidArgument):
            spool.Queue(qdir, subscription="")
        with pytest.raises(spool.InvalidArgument, match="exists"):
            q.add_subscription("late")
        with pytest.raises(spool.NotFound):
            q.remove_subscription("audit")
        with pytest.raises(ValueError, match="NUL"):
            q.add_subscription("a\0b")
        with pytest.raises(TypeError):
            q.add_subscription(b"bytes")  # type: ignore[arg-type]


def _receive_and_nack(q, id, times):
    for count in range(1, times + 1):
        [m] = q.receive(visibility=60)
        assert (m.id, m.receive_count) == (id, count)
        m.nack()


def test_subscription_max_receives_and_dead_letters_by_subscription(qdir):
    """issue 46: a subscription's own max_receives dead-letters a message from it alone; the
    dead letters are peeked, redriven and purged by subscription, back to it only."""
    with spool.Queue.create(qdir) as q:  # the queue's max_receives: 10
        q.add_subscription("two", max_receives=2)
        q.add_subscription("one", max_receives=1)
        q.add_subscription("own")
        assert {s.name: s.max_receives for s in q.subscriptions()} == {"two": 2, "one": 1, "own": 0}
        for bad in (-1, 1 << 32):
            with pytest.raises(ValueError, match="max_receives"):
                q.add_subscription("bad", max_receives=bad)
        first = q.send("poison")
        with spool.Queue(qdir, subscription="two") as two, \
                spool.Queue(qdir, subscription="one") as one, \
                spool.Queue(qdir, subscription="own") as own:
            _receive_and_nack(two, first, 2)
            assert two.receive() == []  # the third receive dead-letters it from "two"
            assert q.stats().dead == 1
            assert q.stats().ready == 1  # the queue's own view still has it
            _receive_and_nack(q, first, 3)
            _receive_and_nack(own, first, 3)
            _receive_and_nack(one, first, 1)
            assert one.receive() == []
            assert q.stats().dead == 2

            [dead] = q.peek_dead_letters(subscription="two")
            assert dead.payload == b"poison"
            assert dead.text_attributes["spool.dead.subscription"] == "two"
            marks = sorted(m.text_attributes["spool.dead.subscription"] for m in q.peek_dead_letters())
            assert marks == ["one", "two"]
            assert len(q.peek_dead_letters(1)) == 1
            assert q.peek_dead_letters(subscription="nosuch") == []
            with pytest.raises(spool.InvalidArgument):
                q.peek_dead_letters(subscription="")

            assert q.redrive(subscription="two") == 1
            assert q.stats().dead == 1  # "one"'s stays
            [back] = two.receive()
            assert back.id > first and back.receive_count == 1 and back.payload == b"poison"
            back.ack()
            assert one.receive() == []  # not sent to "one"
            assert [m.id for m in own.peek()] == [first]  # nor to "own"
            assert [m.id for m in q.peek()] == [first]  # nor to the queue's own view

            assert q.purge_dead_letters(subscription="two") == 0
            assert q.stats().dead == 1
            assert q.purge_dead_letters(subscription="one") == 1
            assert q.stats().dead == 0


def test_errors_are_exceptions_per_code(qdir, tmp_path):
    not_a_queue = tmp_path / "file"
    not_a_queue.write_text("hi")
    with pytest.raises(spool.NotAQueue) as e:
        spool.Queue(str(not_a_queue))
    assert e.value.code == 7 and e.value.code_name == "not a queue"
    assert "file" in str(e.value) and isinstance(e.value, spool.Error)
    with pytest.raises(spool.NotAQueue):
        spool.Queue(str(tmp_path / "absent"))
    with spool.Queue.create(qdir, max_payload=100) as q:
        with pytest.raises(spool.TooLarge, match="too large"):
            q.send(b"x" * 101)
        with pytest.raises(spool.InvalidArgument):
            q.ack("not-a-receipt")
        with pytest.raises(TypeError):
            q.send(12)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            q.send("x", delay=-1)
        m = q.receive(wait=0) or None
        assert m is None
        q.send("once")
        (m,) = q.receive()
        m.ack()
        with pytest.raises(spool.NotFound):
            m.ack()
    with pytest.raises(spool.Error, match="closed"):
        q.send("after close")


def test_back_pressure_raises_queue_full(qdir):
    with spool.Queue.create(qdir, max_ready=2) as q:
        q.send("1")
        q.send("2")
        with pytest.raises(spool.QueueFull) as e:
            q.send("3")
        # Issue 43: "<code name>: <message>", the code named once.
        assert str(e.value).startswith("queue full: ") and str(e.value).count("queue full") == 1, str(e.value)
        t0 = time.monotonic()
        with pytest.raises(spool.QueueFull):
            q.send("3", wait_for_room=0.2)
        assert time.monotonic() - t0 >= 0.15


# ------------------------------------------------------------------ attributes and dedup (issue 26)

def test_attributes_round_trip_as_bytes_values(qdir):
    with spool.Queue(qdir, create=True) as q:
        a = q.send("with", attributes={"trace": "abc", "bin": b"\x00\xff", "empty": "",
                                       "k.v-1_X": "héllo"})
        b = q.send("plain")
        msgs = q.receive(max=10)
        assert [m.id for m in msgs] == [a, b]
        assert msgs[0].attributes == {"trace": b"abc", "bin": b"\x00\xff", "empty": b"",
                                      "k.v-1_X": "héllo".encode()}
        assert msgs[1].attributes == {}
        with pytest.raises(UnicodeDecodeError):
            msgs[0].text_attributes
        for m in msgs:
            m.nack()
        # peek and receive_id carry them too.
        assert q.peek()[0].attributes["trace"] == b"abc"
        assert q.receive_id(a).attributes["empty"] == b""
        # A batch: shared attributes, and SendItems with their own added (theirs win).
        ids = q.send_batch(["x", spool.SendItem("y", attributes={"n": "2", "shared": "mine"})],
                           attributes={"shared": "all"})
        got = {m.id: m for m in q.receive(max=10)}
        assert got[ids[0]].text_attributes == {"shared": "all"}
        assert got[ids[1]].text_attributes == {"shared": "mine", "n": "2"}
        ids = q.send_batch(["p", "q"], attributes={"t": b"1"})
        assert all(m.attributes == {"t": b"1"} for m in q.receive(max=10))


def test_attribute_bounds_raise_invalid_argument_naming_the_problem(qdir):
    with spool.Queue(qdir, create=True) as q:
        q.send("16 is fine", attributes={f"k{i}": "v" for i in range(16)})
        sent = q.stats().sent_total
        with pytest.raises(spool.InvalidArgument, match=r"17.*at most 16"):
            q.send("x", attributes={f"k{i}": "v" for i in range(17)})
        with pytest.raises(spool.InvalidArgument, match=r"'bad key!'"):
            q.send("x", attributes={"ok": "1", "bad key!": "1"})
        with pytest.raises(spool.InvalidArgument, match=r"1 to 64"):
            q.send("x", attributes={"k" * 65: "1"})
        with pytest.raises(spool.InvalidArgument, match=r"'big'.*1025"):
            q.send("x", attributes={"big": b"v" * 1025})
        with pytest.raises(spool.InvalidArgument, match=r"at most 4096"):
            q.send("x", attributes={f"k{i}": b"v" * 1000 for i in range(5)})
        with pytest.raises(spool.InvalidArgument, match="NUL"):
            q.send("x", attributes={"a\0b": "1"})
        with pytest.raises(TypeError):
            q.send("x", attributes={1: "1"})  # type: ignore[dict-item]
        with pytest.raises(TypeError):
            q.send("x", attributes={"n": 1})  # type: ignore[dict-item]
        with pytest.raises(spool.InvalidArgument, match=r"129 bytes; at most 128"):
            q.send("x", dedup_id="d" * 129)
        # One bad item refuses the whole batch, naming it.
        with pytest.raises(spool.InvalidArgument, match=r"message 1 of the batch.*'sp ace'"):
            q.send_batch([spool.SendItem("a"), spool.SendItem("b", attributes={"sp ace": "1"})])
        assert q.stats().sent_total == sent


def _forge_key(qdir: str, msg_id: int, old: bytes, new: bytes) -> None:
    """tests/forge_attr_key.py's forge_key: rewrites a stored key in place, checksum and all."""
    import importlib.util
    path = os.path.join(HERE, "..", "..", "tests", "forge_attr_key.py")
    spec = importlib.util.spec_from_file_location("forge_attr_key", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.forge_key(qdir, msg_id, old, new)


def test_a_stored_key_that_is_not_utf8_is_escaped_not_a_leased_crash(qdir):
    # Issue 48: a forged record's key b"k\xff" raised UnicodeDecodeError from receive()
    # after the whole batch was leased (both messages in flight, neither returned).
    with spool.Queue.create(qdir) as q:
        forged = q.send("forged", attributes={"kk": "v", "ok": "1"})
        after = q.send("after")
    _forge_key(qdir, forged, b"kk", b"k\xff")
    with spool.Queue(qdir) as q:
        msgs = q.receive(max=10)
        assert [m.id for m in msgs] == [forged, after]
        key = min(msgs[0].attributes)
        assert key == "k\udcff" and key.encode(errors="surrogateescape") == b"k\xff"
        assert msgs[0].text_attributes == {"k\udcff": "v", "ok": "1"}
        # Given back to a send, the key is its stored bytes, which the library refuses.
        with pytest.raises(spool.InvalidArgument, match="attribute key"):
            q.send("again", attributes=msgs[0].attributes)
        msgs[0].nack()
        assert q.peek()[0].attributes == {"k\udcff": b"v", "ok": b"1"}
        msgs[1].ack()
        q.receive(max=1)[0].ack()
        s = q.stats()
        assert (s.ready, s.in_flight, s.acked_total) == (0, 0, 2)


def test_dedup_same_id_once_different_ids_twice(qdir):
    with spool.Queue.create(qdir, dedup_window=60) as q:
        assert q.dedup_window == 60
        a = q.send("first", dedup_id="order-1")
        assert q.send("again", dedup_id="order-1") == a
        assert q.send("bytes", dedup_id=b"order-1") == a  # str ids are their UTF-8 bytes
        b = q.send("second", dedup_id="order-2")
        assert b != a
        st = q.stats()
        assert (st.sent_total, st.ready, st.dedup_ids) == (2, 2, 2)
        assert [m.text for m in q.receive(max=10)] == ["first", "second"]
        # Items: against an earlier send, and within the batch.
        ids = q.send_batch([spool.SendItem("x", dedup_id="order-1"),
                            spool.SendItem("y", dedup_id="order-3"),
                            spool.SendItem("z", dedup_id="order-3"), "w"])
        assert ids[0] == a and ids[2] == ids[1] and ids[3] == ids[1] + 1
        assert (q.stats().sent_total, q.stats().dedup_ids) == (4, 3)
        # Another process sending the same id queues nothing and gets the same id.
        child = run_python("""
            import sys, spool
            with spool.Queue(sys.argv[1]) as q:
                print(q.send("from the child", dedup_id="order-2"))
        """, qdir, stdout=subprocess.PIPE)
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0 and int(out) == b
        assert q.stats().sent_total == 4


def test_sent_id_tells_whether_a_send_was_a_duplicate(qdir):
    with spool.Queue.create(qdir, dedup_window=60) as q:
        plain = q.send("plain")
        assert isinstance(plain, int) and isinstance(plain, spool.SentId)
        assert plain.duplicate is False
        first = q.send("first", dedup_id="order-1")
        assert first.duplicate is False
        again = q.send("again", dedup_id="order-1")
        assert again == first and again.duplicate is True
        assert json.loads(json.dumps({"id": again})) == {"id": int(first)}  # still just an int
        assert str(again) == f"{again}" == repr(again) == str(int(first))  # printed as the id
        ids = q.send_batch([spool.SendItem("x", dedup_id="order-1"),
                            spool.SendItem("y", dedup_id="order-2"),
                            spool.SendItem("z", dedup_id="order-2"), "w"])
        assert [i.duplicate for i in ids] == [True, False, True, False]
        assert [i.duplicate for i in q.send_batch(["p", "q"])] == [False, False]
        # Another process: the duplicate is seen from there too.
        child = run_python("""
            import sys, spool
            with spool.Queue(sys.argv[1]) as q:
                sent = q.send("from the child", dedup_id="order-2")
                print(int(sent), sent.duplicate)
        """, qdir, stdout=subprocess.PIPE)
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0 and out.split() == [str(ids[1]).encode(), b"True"]
        assert q.stats().sent_total == 6  # plain, first, y, w, p, q


def test_dedup_id_is_forgotten_after_the_window(qdir):
    with spool.Queue.create(qdir, dedup_window=2.0) as q:  # two sends fit on a loaded machine
        a = q.send("1", dedup_id="w")
        assert q.send("2", dedup_id="w") == a
        time.sleep(2.3)
        assert q.stats().dedup_ids == 0
        assert q.send("3", dedup_id="w") != a



def test_priorities_order_receives_and_are_reported(qdir):
    with spool.Queue(qdir, create=True) as q:
        q.send("low", priority=200)
        q.send("plain")
        q.send("urgent", priority=0)
        q.send_batch(["b1", "b2"], priority=10)
        q.send_batch([spool.SendItem("i5", priority=5), spool.SendItem("i-batch"), "i-plain-batch"],
                     priority=150)
        q.send_batch([spool.SendItem("i-default"), spool.SendItem("i255", priority=255)])
        # Another process sends the most urgent one.
        child = run_python("""
            import sys, spool
            with spool.Queue(sys.argv[1]) as q:
                q.send("from the child", priority=1)
        """, qdir)
        assert child.wait(timeout=60) == 0
        assert [(m.text, m.priority) for m in q.peek(20)] == [
            ("low", 200), ("plain", 128), ("urgent", 0), ("b1", 10), ("b2", 10), ("i5", 5),
            ("i-batch", 150), ("i-plain-batch", 150), ("i-default", 128), ("i255", 255),
            ("from the child", 1)]
        got = []
        while True:
            ms = q.receive(1, visibility=60)
            if not ms:
                break
            got.append((ms[0].text, ms[0].priority))
            ms[0].ack()
        assert got == [("urgent", 0), ("from the child", 1), ("i5", 5), ("b1", 10), ("b2", 10),
                       ("plain", 128), ("i-default", 128), ("i-batch", 150),
                       ("i-plain-batch", 150), ("low", 200), ("i255", 255)]
        sent = q.stats().sent_total
        with pytest.raises(spool.InvalidArgument, match=r"priority is 256: 0 \(most urgent\) to 255"):
            q.send("x", priority=256)
        with pytest.raises(spool.InvalidArgument):
            q.send("x", priority=-1)
        with pytest.raises(spool.InvalidArgument):
            q.send_batch([spool.SendItem("ok"), spool.SendItem("x", priority=2**32 + 5)])
        with pytest.raises(TypeError):
            q.send("x", priority=True)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            q.send("x", priority="1")  # type: ignore[arg-type]
        assert q.stats().sent_total == sent


def test_groups_are_received_one_at_a_time_in_send_order(qdir):
    with spool.Queue(qdir, create=True) as q:
        q.send("a1", group="A")
        q.send_batch(["a2", "a3"], group="A")
        q.send_batch([spool.SendItem("b1", group=b"B\x00\xff"), spool.SendItem("a4"),
                      spool.SendItem("b2", group=b"B\x00\xff"), "u"], group="A")
        q.send("plain")
        # Another process adds to group A: behind a1..a4, whoever sent them.
        child = run_python("""
            import sys, spool
            with spool.Queue(sys.argv[1]) as q:
                q.send("a5 from the child", group="A")
        """, qdir)
        assert child.wait(timeout=60) == 0
        assert [(m.text, m.group) for m in q.peek(20)] == [
            ("a1", b"A"), ("a2", b"A"), ("a3", b"A"), ("b1", b"B\x00\xff"), ("a4", b"A"),
            ("b2", b"B\x00\xff"), ("u", b"A"), ("plain", None), ("a5 from the child", b"A")]
        st = q.stats()
        assert (st.ready, st.blocked) == (3, 6)  # a1, b1, plain ready
        first = q.receive(max=10, visibility=60)
        assert [(m.text, m.group) for m in first] == [("a1", b"A"), ("b1", b"B\x00\xff"),
                                                      ("plain", None)]
        assert "group=b'A'" in repr(first[0]) and "group" not in repr(first[2])
        assert q.receive(max=10) == []
        with pytest.raises(spool.Empty, match=f"waits for message {first[0].id} of its group"):
            q.receive_id(first[0].id + 1)
        # Another process finds nothing either while the firsts are held.
        child = run_python("""
            import sys, spool
            with spool.Queue(sys.argv[1]) as q:
                print(len(q.receive(max=10, visibility=60)))
        """, qdir, stdout=subprocess.PIPE)
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0 and out.strip() == b"0"
        first[0].nack()  # the group gets its first message again, not the next one
        again = q.receive(max=10, visibility=60)
        assert [(m.text, m.receive_count) for m in again] == [("a1", 2)]
        again[0].ack()
        first[2].ack()
        got = []  # while b1 is held, only group A moves, one message per ack
        while True:
            ms = q.receive(max=10, visibility=60)
            if not ms:
                break
            assert len(ms) == 1, [m.text for m in ms]
            got.append(ms[0].text)
            ms[0].ack()
        assert got == ["a2", "a3", "a4", "u", "a5 from the child"]
        assert q.stats().blocked == 1
        first[1].ack()
        assert [(m.text, m.group) for m in q.receive(max=10)] == [("b2", b"B\x00\xff")]
        assert q.stats().blocked == 0


def test_group_bounds_raise_invalid_argument_and_queue_nothing(qdir):
    with spool.Queue(qdir, create=True) as q:
        q.send("128 is fine", group="g" * spool.MAX_GROUP)
        sent = q.stats().sent_total
        with pytest.raises(spool.InvalidArgument, match=r"group_len is 129: a group key is 1 to 128"):
            q.send("x", group="g" * 129)
        with pytest.raises(spool.InvalidArgument, match=r"group_len is 129"):
            q.send_batch(["x", "y"], group=b"g" * 129)
        with pytest.raises(spool.InvalidArgument, match=r"items\[1\]\.group_len is 129"):
            q.send_batch([spool.SendItem("a", group="ok"), spool.SendItem("b", group="g" * 129)])
        with pytest.raises(spool.InvalidArgument, match="group is empty"):
            q.send("x", group="")
        with pytest.raises(TypeError):
            q.send("x", group=17)  # type: ignore[arg-type]
        assert q.stats().sent_total == sent
        assert [m.group for m in q.receive(max=10)] == [b"g" * 128]


def test_nul_bytes_and_empty_dedup_ids_are_refused(qdir, tmp_path):
    """issue 48: a NUL in a path or a receipt ended the C string there (Queue("q\\0/../x")
    opened q; a receipt was read cut short), and dedup_id=b"" was taken as none."""
    with pytest.raises(ValueError, match="NUL"):
        spool.Queue(str(qdir) + "\0/../elsewhere")
    assert not (tmp_path / "elsewhere").exists()
    with spool.Queue.create(qdir, visibility=10) as q:
        q.send("x")
        m = q.receive()[0]
        for call in (q.ack, q.nack, lambda r: q.extend(r, 5)):
            with pytest.raises(ValueError, match="NUL"):
                call(m.receipt + "\0junk")
        with pytest.raises(spool.InvalidArgument, match="dedup id is empty"):
            q.send("y", dedup_id=b"")
        q.ack(m.receipt)
        assert q.stats().sent_total == 1


def test_replay_after_ack_sends_acked_messages_again(qdir, tmp_path):
    with spool.Queue.create(qdir, keep_acked=3600) as q:
        assert q.keep_acked == 3600
        a = q.send("again", attributes={"tenant": "acme"})
        q.send("left alone")
        m = q.receive()[0]
        assert m.id == a
        m.ack()
        st = q.stats()
        assert (st.kept_acked, st.kept_acked_bytes) == (1, 5)
        assert q.replay(since=3600) == {"replayed": 1, "missing": 0}
        got = {m.text: m for m in q.receive(max=10)}
        assert set(got) == {"again", "left alone"}
        attrs = got["again"].text_attributes
        assert attrs["tenant"] == "acme" and attrs["spool.replay.original_id"] == str(a)
        assert attrs["spool.replay.acked_at"].endswith("Z")
        with spool.Queue.create(tmp_path / "other") as other:
            assert q.replay(since=3600, to=tmp_path / "other")["replayed"] == 1
            assert [m.text for m in other.receive(max=10)] == ["again"]
        with pytest.raises(spool.InvalidArgument):
            q.replay(since=1, until=2)

def test_caller_of_the_shorter_0_1_0_send_options_struct(qdir):
    """A binding written for 0.1.0 has a 32-byte spool_send_options: the library's old
    init function writes only those bytes, and spool_send reads only them (the newer fields
    here hold 0xff garbage: read as pointers, they would crash)."""
    lib = spool._capi.lib
    full = spool._capi.spool_send_options
    so = full()
    ctypes.memset(ctypes.byref(so), 0xFF, ctypes.sizeof(full))
    legacy = lib.spool_send_options_init
    legacy.argtypes, legacy.restype = [ctypes.POINTER(full)], None
    legacy(ctypes.byref(so))
    assert so.size == full.attributes.offset == 32
    assert so.attribute_count == so.dedup_id_len == 2**64 - 1  # not written
    with spool.Queue(qdir, create=True) as q:
        ids = []
        for _ in range(2):
            out = ctypes.c_uint64()
            assert lib.spool_send(q._handle(), b"old", 3, ctypes.byref(so), ctypes.byref(out)) == 0
            ids.append(out.value)
        assert ids[1] == ids[0] + 1  # no dedup id was read
        assert [m.attributes for m in q.receive(max=10)] == [{}, {}]


def test_stale_ack_raises_lease_lost_and_changes_nothing(qdir):
    with spool.Queue(qdir, create=True) as q:
        q.send("job")
        (first,) = q.receive(visibility=0.1)
        time.sleep(0.25)  # the lease ends
        (second,) = q.receive(visibility=10)
        assert second.id == first.id and second.receive_count == 2
        with pytest.raises(spool.LeaseLost, match="lease lost") as e:
            first.ack()
        assert str(e.value).count("lease lost") == 1, str(e.value)
        with pytest.raises(spool.LeaseLost):
            first.nack()
        with pytest.raises(spool.LeaseLost):
            first.extend(5)
        st = q.stats()
        assert st.in_flight == 1 and st.acked_total == 0
        second.ack()
        assert q.stats().acked_total == 1


def test_remove_deletes_a_message_by_id_and_its_receipt_is_then_not_found(qdir):
    with spool.Queue(qdir, create=True) as q:
        first, second = q.send("leased"), q.send("ready")
        (m,) = q.receive(visibility=60)
        assert m.id == first
        q.remove(first)
        q.remove(second, sync=True)
        with pytest.raises(spool.NotFound, match="not in the queue"):
            q.remove(second)
        with pytest.raises(spool.NotFound):
            m.ack()
        st = q.stats()
        assert st.acked_total == 2 and st.ready == 0 and st.in_flight == 0


def test_nack_delay_dead_letters_redrive_peek(qdir):
    with spool.Queue.create(qdir, max_receives=2) as q:
        i = q.send("poison")
        assert [m.payload for m in q.peek()] == [b"poison"]
        (m,) = q.receive()
        m.nack(delay=0.2)
        assert q.receive() == [] and q.stats().delayed == 1
        (m,) = q.receive(wait=2)
        assert m.receive_count == 2
        m.nack()
        assert q.receive() == []  # third delivery: dead-lettered instead
        assert q.stats().dead == 1
        dlq = q.dead_letters()
        assert dlq.stats().ready == 1
        assert q.redrive() == 1
        (m,) = q.receive()
        assert m.payload == b"poison" and m.receive_count == 1 and m.id != i
        m.ack()
        assert q.verify() == []
        assert q.purge() == 0


# ------------------------------------------------------------------ processes

N_COMPETING = 2000


def _competing_worker(qdir: str, out, ready) -> None:
    # The child opens the queue itself (a Queue must not cross fork).
    seen = []
    with spool.Queue(qdir, create=True) as q:
        ready.wait(60)  # every worker is there before the first message is sent
        while True:
            msgs = q.receive(max=8, visibility=30, wait=0.3)
            if not msgs:
                st = q.stats()
                if st.acked_total >= N_COMPETING and st.ready == 0 and st.in_flight == 0:
                    break
                continue
            for m in msgs:
                m.ack()
                seen.append(int(m.text))
    out.put(seen)


def test_competing_workers_ack_every_message_once(qdir):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    # The sends wait for every worker: one that had the queue to itself while the others
    # were still starting could drain all 2,000 before they came (seen under load).
    ready = ctx.Barrier(4 + 1)
    workers = [ctx.Process(target=_competing_worker, args=(qdir, out, ready)) for _ in range(4)]
    with spool.Queue(qdir, create=True):
        pass  # created before the workers start
    for w in workers:
        w.start()
    ready.wait(60)
    with spool.Queue(qdir, create=True) as q:
        for start in range(0, N_COMPETING, 100):
            q.send_batch(str(i) for i in range(start, start + 100))
    results = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    counts = collections.Counter(i for r in results for i in r)
    assert sorted(counts) == list(range(N_COMPETING))
    assert set(counts.values()) == {1}, [i for i, c in counts.items() if c != 1][:10]
    assert sum(1 for r in results if r) >= 2, [len(r) for r in results]
    with spool.Queue(qdir, create=True) as q:
        st = q.stats()
        assert st.acked_total == N_COMPETING and st.sent_total == N_COMPETING


def test_queue_from_parent_refuses_use_in_forked_child(qdir):
    with spool.Queue(qdir, create=True) as q:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                q.send("from the child")
                os.write(w, b"sent")
            except spool.Error as e:
                os.write(w, b"refused" if "open the queue again" in str(e) else b"other")
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 100) == b"refused"
        assert q.stats().sent_total == 0


WORKER_THAT_HANGS = """
    import sys, time, spool
    q = spool.Queue(sys.argv[1])
    for msg in q.messages(visibility=float(sys.argv[2]), renew=sys.argv[3] == "renew"):
        print("got", msg.id, flush=True)
        time.sleep(3600)   # "working" until killed
"""


@pytest.mark.parametrize("renew", ["renew", "plain"])
def test_kill9_of_a_worker_holding_a_lease_gives_the_message_back(qdir, renew):
    with spool.Queue(qdir, create=True) as q:
        mid = q.send("work")
        # With renew, the lease is 30 s but bound to the worker (keeper): back at once.
        # Without, a 1 s lease that nobody renews: back when it runs out.
        visibility = "30" if renew == "renew" else "1"
        p = run_python(WORKER_THAT_HANGS, qdir, visibility, renew, stdout=subprocess.PIPE, text=True)
        try:
            line = p.stdout.readline()
            assert line.split() == ["got", str(mid)], line
            assert q.receive() == []  # leased by the worker
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
            t0 = time.monotonic()
            msgs = q.receive(wait=10)
            took = time.monotonic() - t0
        finally:
            if p.poll() is None:
                p.kill()
        assert [m.id for m in msgs] == [mid]
        assert msgs[0].receive_count == 2
        assert took < (5 if renew == "renew" else 10)
        msgs[0].ack()


def test_messages_renews_the_lease_while_the_body_runs(qdir):
    with spool.Queue(qdir, create=True) as q, spool.Queue(qdir) as other:
        q.send("slow")
        for msg in q.messages(visibility=0.3, wait=0.1, idle_timeout=0.3):
            time.sleep(1.0)  # over three leases long
            assert other.receive() == [], "the lease ran out while the body worked"
        assert q.stats().acked_total == 1  # acked when the body finished


def test_messages_nacks_what_an_exception_leaves(qdir):
    with spool.Queue(qdir, create=True) as q:
        q.send("boom")
        with pytest.raises(RuntimeError):
            for msg in q.messages(visibility=30, wait=0.1):
                raise RuntimeError("handler failed")
        # the generator is closed with the frame: the message is ready again at once
        import gc
        gc.collect()
        (m,) = q.receive()
        assert m.receive_count == 2 and q.stats().nacked_total == 1


def test_cli_producer_python_consumer(qdir, spool_cli):
    n = 3000
    subprocess.run([spool_cli, "init", qdir], check=True, stdout=subprocess.DEVNULL)
    with spool.Queue(qdir, create=True) as q:
        producer = subprocess.Popen([spool_cli, "send", qdir, "--lines"], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL)
        producer.stdin.write("".join(f"line-{i}\n" for i in range(n)).encode())
        producer.stdin.close()
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for m in q.receive(max=64, wait=1):
                got.append(m.text)
                m.ack()
        assert producer.wait(30) == 0
        assert sorted(got) == sorted(f"line-{i}" for i in range(n))
        stats = subprocess.run([spool_cli, "stats", qdir, "--json"], check=True,
                               capture_output=True, text=True).stdout.replace(" ", "")
        assert f'"acked_total":{n}' in stats and '"ready":0' in stats


PY_PRODUCER = """
    import sys, spool
    with spool.Queue(sys.argv[1]) as q:
        for start in range(0, int(sys.argv[2]), 50):
            q.send_batch(f"py-{i}" for i in range(start, start + 50))
"""

PY_CONSUMER = """
    import os, sys, spool
    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with spool.Queue(sys.argv[1]) as q:
        for msg in q.messages(batch=8, wait=0.2, idle_timeout=3):
            os.write(fd, b"%d %s\\n" % (msg.id, msg.payload))
"""


def test_c_worker_python_worker_and_cli_on_one_queue_at_once(qdir, spool_cli, c_worker, tmp_path):
    n = 2000
    subprocess.run([spool_cli, "init", qdir], check=True, stdout=subprocess.DEVNULL)
    c_out, py_out = str(tmp_path / "c.txt"), str(tmp_path / "py.txt")
    # Two consumers, C and Python, start first and compete; the CLI and a Python process
    # produce at the same time.
    consumers = [subprocess.Popen([c_worker, qdir, "--idle-exit", "3", "--out", c_out]),
                 run_python(PY_CONSUMER, qdir, py_out)]
    cli = subprocess.Popen([spool_cli, "send", qdir, "--lines"], stdin=subprocess.PIPE,
                           stdout=subprocess.DEVNULL)
    py_producer = run_python(PY_PRODUCER, qdir, str(n))
    for start in range(0, n, 200):  # the CLI's lines arrive in bursts
        cli.stdin.write("".join(f"cli-{i}\n" for i in range(start, start + 200)).encode())
        cli.stdin.flush()
        time.sleep(0.01)
    cli.stdin.close()
    assert cli.wait(60) == 0 and py_producer.wait(60) == 0
    for c in consumers:
        assert c.wait(120) == 0
    lines = {}
    for path in (c_out, py_out):
        with open(path) as f:
            lines[path] = [line.split(" ", 1)[1].rstrip("\n") for line in f]
    every = lines[c_out] + lines[py_out]
    want = [f"cli-{i}" for i in range(n)] + [f"py-{i}" for i in range(n)]
    assert collections.Counter(every) == collections.Counter(want)  # each exactly once
    assert lines[c_out] and lines[py_out], {p: len(v) for p, v in lines.items()}
    with spool.Queue(qdir, create=True) as q:
        st = q.stats()
        assert (st.acked_total, st.ready, st.in_flight) == (2 * n, 0, 0)


# ------------------------------------------------------------------ the GIL

def test_long_poll_leaves_the_gil_to_other_threads(qdir):
    with spool.Queue(qdir, create=True) as q:
        received = []
        entered = threading.Event()

        def poll():
            entered.set()
            received.extend(q.receive(wait=3))

        t = threading.Thread(target=poll)
        t.start()
        entered.wait()
        time.sleep(0.1)  # the poller is inside spool_receive now
        # Pure-Python work in this thread: it runs only if the poller released the GIL.
        start = last = time.monotonic()
        longest_gap = 0.0
        while time.monotonic() - start < 1.0:
            now = time.monotonic()
            longest_gap = max(longest_gap, now - last)
            last = now
            sum(range(200))
        assert t.is_alive(), "the long poll returned early"
        assert longest_gap < 0.5, f"this thread stalled {longest_gap:.2f} s behind the poll"
        # A send wakes the poller at once, long before its 3 s.
        sent = time.monotonic()
        sender = run_python("import sys, spool; spool.Queue(sys.argv[1]).send('wake')", qdir)
        assert sender.wait(30) == 0
        t.join(5)
        assert not t.is_alive() and [m.text for m in received] == ["wake"]
        assert time.monotonic() - sent < 2.5


# ------------------------------------------------------------------ issue 43: what users of the peers expect

def test_version_repr_and_len(qdir):
    assert spool.__version__ == "0.1.0" and "__version__" in spool.__all__
    with spool.Queue(qdir, create=True) as q:
        assert repr(q) == f"<spool.Queue {str(qdir)!r} open>"
        assert len(q) == 0 and q  # an empty queue is still true
        q.send("a")
        q.send("b")
        (m,) = q.receive()
        assert len(q) == 2  # one ready, one in flight
        m.ack()
        assert len(q) == 1
    assert repr(q).endswith(" closed>")


def test_a_misspelled_path_is_an_error_not_a_new_queue(tmp_path):
    """issue 43: Queue(path) created an empty queue wherever it was pointed, so a typo
    gave a worker that waited forever on a queue nobody sends to."""
    with spool.Queue.create(tmp_path / "jobs") as q:
        q.send("work")
    with pytest.raises(spool.NotAQueue, match="Queue.create") as e:
        spool.Queue(tmp_path / "jbos")
    assert "jbos" in str(e.value)
    assert not (tmp_path / "jbos").exists(), "the failed open left a directory behind"
    with spool.Queue(tmp_path / "jobs") as q:  # an existing queue opens without create
        assert q.stats().ready == 1
    # Stored settings are only meaningful when creating: refused, not silently ignored.
    with pytest.raises(ValueError, match="visibility.*create=True"):
        spool.Queue(tmp_path / "jobs", visibility=5)
    with spool.Queue(tmp_path / "new", create=True, visibility=5) as q:
        assert q.visibility == 5


def test_ctrl_c_ends_a_long_poll_within_a_second(qdir):
    """issue 43: a receive(wait=60) ignored Ctrl-C until the wait ended (Python runs signal
    handlers only between C calls)."""
    spool.Queue.create(qdir).close()
    child = run_python("""
        import sys, time, spool
        q = spool.Queue(sys.argv[1])
        print("polling", flush=True)
        start = time.monotonic()
        try:
            q.receive(wait=60)
        except KeyboardInterrupt:
            print(f"interrupted after {time.monotonic() - start:.2f}", flush=True)
            sys.exit(3)
        print("the poll ended without the interrupt", flush=True)
    """, qdir, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "polling"
        time.sleep(0.7)  # well inside the poll
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        assert child.wait(10) == 3, child.stdout.read()
        assert time.monotonic() - sent < 1.5, f"took {time.monotonic() - sent:.2f} s"
        assert child.stdout.read().startswith("interrupted")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
