"""spool: a persistent, brokerless message queue for worker processes on one host.

A queue is a directory that any number of processes, in Python, C, C++ or the shell (the
``spool`` CLI), open at once; no daemon is involved. Delivery is at-least-once with leases:
a received message is hidden for its visibility timeout and comes back if it is not acked
in time. This package is the C API of libspool (``spool.h``) through ctypes; it needs no
compiler. Semantics: docs/semantics.md; this binding: docs/python.md.

    import spool

    with spool.Queue.create("/var/spool/jobs") as q:   # spool.Queue(path) opens an existing one
        q.send("resize photo 17")
        for msg in q.messages(idle_timeout=5):   # the lease is renewed while you work
            handle(msg.payload)                  # acked when the body finishes

Messages may carry attributes (``q.send(body, attributes={"trace": "7f3a"})``; read back as
``msg.attributes``, a dict of str to bytes, or ``msg.text_attributes`` decoded) and a
deduplication id (``q.send(body, dedup_id="order-17")``: a second send of that id within the
queue's dedup window queues nothing and returns the first message's id, a :class:`SentId`
whose ``duplicate`` is True), a priority (``q.send(body, priority=0)``: 0 is the most
urgent, 255 the least, 128 the default; ``msg.priority`` on receipt), and an ordered group
(``q.send(body, group="account-17")``: the messages of one group are received one at a time,
in send order; ``msg.group`` on receipt, as bytes).

Errors are exceptions, one class per code, all subclasses of :class:`spool.Error`.

Threads and processes: a :class:`Queue` may be shared by the threads of one process, and
calls that block (a receive with ``wait``) release the GIL. After ``fork()`` (the default
start method of ``multiprocessing`` on Linux) a child must open the queue again: a Queue
opened by its parent raises :class:`Error` there.
"""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

from . import _capi
from ._capi import lib as _lib

__all__ = [
    "Queue", "Message", "SendItem", "SentId", "Stats", "Subscription", "Error", "Empty", "LeaseLost", "NotFound",
    "InvalidArgument", "TooLarge", "QueueFull", "NotAQueue", "Incompatible", "NoSpace",
    "IoError", "Corrupt", "ReadOnly", "DEFAULT_PRIORITY", "MAX_GROUP", "library_path",
    "__version__",
]

__version__ = "0.1.0"
"""This package's version, the same as libspool's (meson.build) and python/pyproject.toml's."""

Payload = Union[bytes, bytearray, memoryview, str]
AttributeValue = Union[bytes, bytearray, memoryview, str]
"""An attribute value given to a send: any bytes, or str sent as UTF-8."""
Attributes = Mapping[str, AttributeValue]
"""A message's attributes at send: at most 16; keys 1 to 64 characters of [A-Za-z0-9._-];
values at most 1024 bytes; keys and values together at most 4096 bytes (InvalidArgument
naming the key and the bound otherwise). Keys are encoded with errors="surrogateescape",
the rule received keys are decoded with (see :class:`Message`)."""

library_path: str = _capi._find()
"""What the C library was loaded as (``$SPOOL_LIBRARY``, or the name found)."""


# ------------------------------------------------------------------------- errors

class Error(Exception):
    """A spool call failed. ``code`` is the C API's number (spool::Code), ``code_name`` its
    short name ("lease lost"), and ``str(e)`` the library's message naming what is wrong."""

    code: int = -1

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def code_name(self) -> str:
        return str(_lib.spool_code_name(self.code).decode())


class Empty(Error):
    """Nothing was receivable (receive_id of a leased or delayed message)."""
    code = 1


class LeaseLost(Error):
    """The receipt's lease expired and the message was received again: nothing changed.
    Drop the result of the work; another consumer is doing it."""
    code = 2


class NotFound(Error):
    """Unknown or already-acked message or receipt."""
    code = 3


class InvalidArgument(Error, ValueError):
    """A malformed receipt, option or input."""
    code = 4


class TooLarge(Error, ValueError):
    """The payload is over the queue's max_payload."""
    code = 5


class QueueFull(Error):
    """A back-pressure limit (max_ready / max_bytes) was reached, or every owner slot is taken."""
    code = 6


class NotAQueue(Error):
    """The directory or file is not a spool queue (or it does not exist and create=False)."""
    code = 7


class Incompatible(Error):
    """A newer on-disk format, or an index of an incompatible build."""
    code = 8


class NoSpace(Error, OSError):
    """The disk is full: free space, then retry (receive, ack and nack keep working)."""
    code = 9


class IoError(Error, OSError):
    """Any other system error; the message names the call, the path and the errno text."""
    code = 10


class Corrupt(Error):
    """A checksum or structure failure in stored data (see Queue.verify)."""
    code = 11


class ReadOnly(Error, PermissionError):
    """The caller may not change this queue (only stats and peek work)."""
    code = 12


_ERRORS = {cls.code: cls for cls in (Empty, LeaseLost, NotFound, InvalidArgument, TooLarge,
                                      QueueFull, NotAQueue, Incompatible, NoSpace, IoError,
                                      Corrupt, ReadOnly)}


def _raise(code: int) -> None:
    text = (_lib.spool_last_error() or b"").decode(errors="replace")
    raise _ERRORS.get(code, Error)(text, code)


def _check(code: int) -> None:
    if code != 0:
        _raise(code)


def _ms(seconds: float, what: str) -> int:
    if seconds < 0:
        raise ValueError(f"{what} must be >= 0 seconds, not {seconds}")
    return int(round(seconds * 1000))


def _cstr(text: bytes, what: str) -> bytes:
    """``text`` for a C string: ValueError for a NUL byte, where C would end it (a path
    "q\\0/../../etc" opened q; a receipt with a NUL was read cut short)."""
    if b"\0" in text:
        raise ValueError(f"{what} contains a NUL byte: {text!r}")
    return text


def _subscription_name(name: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"a subscription name is a str, not {type(name).__name__}")
    return _cstr(name.encode(errors="surrogateescape"), "the subscription name")


def _dead_letters_of(subscription: Optional[str]) -> bytes:
    """The C filter of the dead-letter calls: b"" (every dead letter) for None."""
    if subscription is None:
        return b""
    if subscription == "":
        raise InvalidArgument("the subscription is \"\": name one, or None for every dead letter",
                              InvalidArgument.code)
    return _subscription_name(subscription)


def _bytes(payload: Payload, what: str = "a payload") -> bytes:
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    raise TypeError(f"{what} is bytes or str, not {type(payload).__name__}")


def _address(data: bytes) -> Optional[int]:
    """The address of ``data``'s buffer (no copy): valid while ``data`` lives."""
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value


def _c_attributes(attributes: Optional[Attributes], keep: list[Any]) -> tuple[Any, int]:
    """``attributes`` as a C array of spool_attribute and its length ((None, 0) for none).
    The bytes the array points into are appended to ``keep``: hold it during the call."""
    if not attributes:
        return None, 0
    if not isinstance(attributes, Mapping):
        raise TypeError(f"attributes is a mapping of str to bytes or str, not "
                        f"{type(attributes).__name__}")
    arr = (_capi.spool_attribute * len(attributes))()
    for i, (key, value) in enumerate(attributes.items()):
        if not isinstance(key, str):
            raise TypeError(f"an attribute key is str, not {type(key).__name__}")
        if "\0" in key:
            raise InvalidArgument(f"invalid argument: attribute key {key!r} holds a NUL", 4)
        k = key.encode(errors="surrogateescape")  # a received key's bytes back (Message)
        v = _bytes(value, f"attribute {key!r}")
        keep.extend((k, v))
        arr[i].key = k
        arr[i].value = _address(v)
        arr[i].value_len = len(v)
    keep.append(arr)
    return arr, len(attributes)


DEFAULT_PRIORITY = 128
"""The priority of a message sent without one (0 is the most urgent, 255 the least)."""


def _c_priority(priority: Optional[int]) -> tuple[int, int]:
    """(has_priority, priority) of the C structs; None: the default."""
    if priority is None:
        return 0, DEFAULT_PRIORITY
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority is an int, not {type(priority).__name__}")
    if not 0 <= priority <= 255:  # before ctypes truncates it to a C int
        raise InvalidArgument(f"invalid argument: priority is {priority}: 0 (most urgent) to 255", 4)
    return 1, priority


def _c_dedup_id(dedup_id: Union[str, bytes, None], keep: list[Any]) -> tuple[Optional[int], int]:
    """A dedup id's address and length ((None, 0) for none); its bytes go to ``keep``."""
    if dedup_id is None:
        return None, 0
    d = _bytes(dedup_id, "a dedup id")
    if not d:  # length 0 reads as no dedup id, which the caller did not ask for
        raise InvalidArgument("invalid argument: dedup id is empty: a dedup id is 1 to 128 bytes "
                              "(None: none)", 4)
    keep.append(d)
    return _address(d), len(d)


MAX_GROUP = 128
"""The longest group key, in bytes."""


def _c_group(group: Union[str, bytes, None], keep: list[Any]) -> tuple[Optional[int], int]:
    """A group key's address and length ((None, 0) for none); its bytes go to ``keep``."""
    if group is None:
        return None, 0
    g = _bytes(group, "a group")
    if not g:  # the C API reads length 0 as no group, which the caller did not ask for
        raise InvalidArgument("invalid argument: group is empty: a group key is 1 to "
                              f"{MAX_GROUP} bytes (None: no group)", 4)
    keep.append(g)
    return _address(g), len(g)


_SYNC = {"always": 0, "interval": 1, "never": 2}
_POLL_SLICE_MS = 500
"""The longest one C call of a long poll waits: how late a Ctrl-C can be."""


# ------------------------------------------------------------------------- values

@dataclass(frozen=True)
class Stats:
    """A snapshot of a queue's counters (Queue.stats())."""
    ready: int
    in_flight: int
    delayed: int
    dead: int
    oldest_ready_age: float  # seconds
    sent_total: int
    acked_total: int
    dead_lettered_total: int
    expired_total: int
    nacked_total: int
    bytes: int
    bytes_on_disk: int
    segments: int
    next_id: int
    dedup_ids: int  # dedup ids remembered now (sent within the queue's dedup window)
    kept_acked: int = 0  # acked messages kept for replay (acked within keep_acked)
    kept_acked_bytes: int = 0  # and their payload bytes
    blocked: int = 0  # in an ordered group, behind an earlier message of it
    paused: bool = False  # Queue.pause(): delivers nothing until resume()

    def workers_needed(self, rate_per_worker: float, latency_target: float) -> int:
        """Workers that drain the ready backlog within ``latency_target`` seconds when each
        handles ``rate_per_worker`` messages a second: ceil(ready / (rate x target))."""
        s = _capi.spool_stats(size=ctypes.sizeof(_capi.spool_stats), ready=self.ready)
        return int(_lib.spool_workers_needed(ctypes.byref(s), rate_per_worker, latency_target))


@dataclass(frozen=True)
class Subscription:
    """A subscription of a queue (:meth:`Queue.subscriptions`)."""
    name: str
    from_id: int  # the first message id it gets
    messages: int  # in it now, leased or not
    in_flight: int  # of them, leased
    max_receives: int = 0  # its own (add_subscription); 0: the queue's


@dataclass(frozen=True)
class SendItem:
    """One message of :meth:`Queue.send_batch` with attributes, a dedup id, a priority and
    an ordered group of its own (None: the batch's ``priority`` and ``group``)."""
    payload: Payload
    attributes: Optional[Attributes] = None
    dedup_id: Union[str, bytes, None] = None
    priority: Optional[int] = None
    group: Union[str, bytes, None] = None


class SentId(int):
    """What a send returns: the message's id, an int, that also tells whether the send was
    a duplicate. ``duplicate`` is True when its dedup id was sent within the queue's dedup
    window: nothing was queued and this is the first message's id. An int, printed and
    compared as one, so that code that only wants the id (``str(q.send(...))``,
    ``json.dumps``, ``id + 1``) sees none of this."""

    duplicate: bool

    def __new__(cls, id: int, duplicate: bool = False) -> "SentId":
        self = super().__new__(cls, id)
        self.duplicate = duplicate
        return self


class Message:
    """One delivery of a message. ``payload`` is a copy (bytes), ``text`` the same decoded
    as UTF-8; ``attributes`` the attributes it was sent with (a dict of str to bytes, the
    values as sent: str values come back UTF-8 encoded), ``text_attributes`` the same with
    the values decoded; ``priority`` the one it was sent with (0 most urgent to 255;
    :data:`DEFAULT_PRIORITY` if none); ``group`` its ordered group as bytes, as the
    attribute values are (a str group comes back UTF-8 encoded; a key may be any bytes),
    or None. An attribute key that is not UTF-8 (a send refuses one; only a forged record
    holds one) is decoded with errors="surrogateescape", as os.fsdecode does: a byte that is
    not UTF-8 becomes a lone surrogate (b"k\\xff" -> "k\\udcff"), and
    ``key.encode(errors="surrogateescape")`` gives the stored bytes back; so a receive never
    fails on a key after leasing. Settle it once with :meth:`ack` or :meth:`nack`;
    :meth:`extend` renews the lease. Messages from :meth:`Queue.peek` have no receipt and
    cannot be settled."""

    __slots__ = ("id", "payload", "attributes", "priority", "group", "receive_count", "enqueued",
                 "receipt", "_queue", "_keeper", "settled", "lease_lost")

    def __init__(self, queue: "Queue", m: _capi.spool_message,
                 attributes: dict[str, bytes], priority: int, group: Optional[bytes]) -> None:
        self.id: int = m.id
        self.payload: bytes = ctypes.string_at(m.payload, m.payload_len) if m.payload_len else b""
        self.attributes: dict[str, bytes] = attributes
        self.priority: int = priority
        self.group: Optional[bytes] = group
        self.receive_count: int = m.receive_count
        self.enqueued: float = m.enqueued_ns / 1e9  # seconds since the epoch, like time.time()
        self.receipt: str = (m.receipt or b"").decode()
        self._queue = queue
        self._keeper: Optional[int] = None
        self.settled = False  # acked or nacked through this object
        self.lease_lost = False  # messages(): the automatic ack found the lease lost

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode()

    @property
    def text_attributes(self) -> dict[str, str]:
        """The attributes with their values decoded as UTF-8 (UnicodeDecodeError for a value
        that is not)."""
        return {k: v.decode() for k, v in self.attributes.items()}

    def ack(self, *, sync: bool = False) -> None:
        """Deletes the message. ``sync=True``: returns only once the ack is on disk.
        Raises LeaseLost if the lease expired and someone else received the message."""
        self._stop_keeper()
        self._queue.ack(self.receipt, sync=sync)
        self.settled = True

    def nack(self, delay: float = 0.0) -> None:
        """Returns the message to the queue, receivable again after ``delay`` seconds."""
        self._stop_keeper()
        self._queue.nack(self.receipt, delay=delay)
        self.settled = True

    def extend(self, visibility: float) -> None:
        """Renews the lease to end ``visibility`` seconds from now."""
        self._queue.extend(self.receipt, visibility)

    def _stop_keeper(self) -> None:
        if self._keeper is not None:
            _lib.spool_keeper_free(self._keeper)
            self._keeper = None

    def __repr__(self) -> str:
        return (f"<spool.Message id={self.id} receive_count={self.receive_count} "
                f"priority={self.priority} "
                f"{'' if self.group is None else f'group={self.group!r} '}"
                f"payload={self.payload[:40]!r}{'...' if len(self.payload) > 40 else ''}>")


# ------------------------------------------------------------------------- the queue

class Queue:
    """A queue directory, opened. ``Queue(path)`` opens an existing queue and raises
    NotAQueue if there is none (a misspelled path is an error, not a new empty queue, as
    with the CLI, where ``spool init`` creates); ``Queue(path, create=True)`` or
    :meth:`Queue.create` creates it when the directory holds none.

    Settings marked [stored] are fixed when the queue is created: they may be given only
    with ``create=True`` (ValueError otherwise), and opening a queue that already exists
    ignores them. None means the library's default. Durations are in seconds.

    :param visibility: [stored] default lease of receive (30 s)
    :param max_receives: [stored] deliveries before a message is dead-lettered (10; 0: never)
    :param sync: [stored] "always", "interval" (default) or "never"
    :param sync_interval: [stored] with "interval": the longest a write stays unsynced (0.05 s)
    :param segment_size: [stored] the largest segment file (64 MiB); segments start at 256 KiB and double
    :param max_payload: [stored] largest message in bytes (0: 1 MiB)
    :param retention_max_age: [stored] drop ready messages older than this (0: off)
    :param retention_max_bytes: [stored] drop the oldest ready messages past this (0: off)
    :param max_ready: [stored] back-pressure: sends fail with QueueFull past this many
        waiting messages (0: off)
    :param max_bytes: [stored] back-pressure on payload bytes (0: off)
    :param dedup_window: [stored] how long a dedup id is remembered after its message was
        sent (300 s; 0.001 s to 7 days)
    :param keep_acked: [stored] replay after ack: keep acked messages in the log this many
        seconds after their ack, for :meth:`replay` (0: off, the default; at most 30 days)
    :param create: create the queue if the directory holds none (False: NotAQueue)
    :param subscription: read this subscription (:meth:`add_subscription`) instead of the
        queue's own view: receive, receive_id, ack, nack, extend, bind_leases, peek,
        stats and ``len()`` act on its messages, with leases and acks of its own; remove,
        purge, pause, resume, release and replay raise InvalidArgument. NotFound if
        the queue has no subscription of that name.

    Raises NotAQueue, Incompatible, ReadOnly, IoError. Use as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, visibility: Optional[float] = None,
                 max_receives: Optional[int] = None, sync: Optional[str] = None,
                 sync_interval: Optional[float] = None, segment_size: Optional[int] = None,
                 max_payload: Optional[int] = None, retention_max_age: Optional[float] = None,
                 retention_max_bytes: Optional[int] = None, max_ready: Optional[int] = None,
                 max_bytes: Optional[int] = None, dedup_window: Optional[float] = None,
                 keep_acked: Optional[float] = None, create: bool = False,
                 subscription: Optional[str] = None) -> None:
        if not create:
            given = [name for name, value in (
                ("visibility", visibility), ("max_receives", max_receives), ("sync", sync),
                ("sync_interval", sync_interval), ("segment_size", segment_size),
                ("max_payload", max_payload), ("retention_max_age", retention_max_age),
                ("retention_max_bytes", retention_max_bytes), ("max_ready", max_ready),
                ("max_bytes", max_bytes), ("dedup_window", dedup_window),
                ("keep_acked", keep_acked)) if value is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: stored when a queue is created; pass "
                                 "create=True (or use Queue.create) to create the queue with "
                                 "them (an existing queue keeps its own)")
        o = _capi.spool_options()
        _lib.spool_options_init_size(ctypes.byref(o), ctypes.sizeof(o))
        if visibility is not None:
            o.visibility_ms = _ms(visibility, "visibility")
        if max_receives is not None:
            o.max_receives = max_receives
        if sync is not None:
            if sync not in _SYNC:
                raise ValueError(f"sync is one of {', '.join(_SYNC)}, not {sync!r}")
            o.sync = _SYNC[sync]
        if sync_interval is not None:
            o.sync_interval_ms = _ms(sync_interval, "sync_interval")
        for name, value in (("segment_size", segment_size), ("max_payload", max_payload),
                            ("retention_max_bytes", retention_max_bytes),
                            ("max_ready", max_ready), ("max_bytes", max_bytes)):
            if value is not None:
                setattr(o, name, value)
        if retention_max_age is not None:
            o.retention_max_age_ms = _ms(retention_max_age, "retention_max_age")
        if dedup_window is not None:
            o.dedup_window_ms = _ms(dedup_window, "dedup_window")
        if keep_acked is not None:
            o.keep_acked_ms = _ms(keep_acked, "keep_acked")
        o.create = 1 if create else 0
        handle = ctypes.c_void_p()
        self._h: Optional[int] = None
        self._owner: Optional[Queue] = None
        self._pid = os.getpid()
        self._dir = os.fsdecode(path)  # for repr, also once closed
        self._subscription: Optional[str] = subscription
        if subscription is None:
            code = _lib.spool_open(_cstr(os.fsencode(path), "the queue path"), ctypes.byref(o),
                                   ctypes.byref(handle))
        else:
            code = _lib.spool_open_subscription(
                _cstr(os.fsencode(path), "the queue path"), ctypes.byref(o),
                _subscription_name(subscription), ctypes.byref(handle))
        if code == NotAQueue.code and not create and not os.path.exists(path):
            raise NotAQueue((_lib.spool_last_error() or b"").decode(errors="replace") +
                            "; to create it: spool.Queue.create(path), Queue(path, "
                            "create=True) or spool init PATH", code)
        _check(code)
        self._h = handle.value

    @classmethod
    def create(cls, path: Union[str, "os.PathLike[str]"], **settings: Any) -> "Queue":
        """Opens the queue in ``path``, creating it (and the directory) if there is none:
        ``Queue(path, create=True, **settings)``. The [stored] settings apply only to a new
        queue; an existing one keeps its own."""
        return cls(path, create=True, **settings)

    @classmethod
    def _borrowed(cls, owner: "Queue", handle: int) -> "Queue":
        q = cls.__new__(cls)
        q._h, q._owner, q._pid = handle, owner, owner._pid
        q._subscription = None
        q._dir = os.fsdecode(_lib.spool_dir(handle))
        return q

    def _handle(self) -> int:
        if self._h is None:
            raise Error("the queue is closed", 4)
        if os.getpid() != self._pid:
            raise Error("this Queue was opened by another process (before fork): open the "
                        "queue again in this process", 4)
        return self._h

    # -- lifetime

    def close(self) -> None:
        """Closes the queue (its bound leases return to ready). Idempotent. Not to be called
        while another thread uses the queue. A dead-letter queue closes with its owner."""
        h, self._h = self._h, None
        if h is not None and self._owner is None and os.getpid() == self._pid:
            _lib.spool_close(h)  # in a forked child the parent's handle is dropped, not closed

    def __enter__(self) -> "Queue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def path(self) -> str:
        """The queue's directory, as given."""
        return os.fsdecode(_lib.spool_dir(self._handle()))

    @property
    def visibility(self) -> float:
        """The queue's stored default lease, in seconds."""
        o = _capi.spool_options(size=ctypes.sizeof(_capi.spool_options))
        _check(_lib.spool_get_options(self._handle(), ctypes.byref(o)))
        return float(o.visibility_ms) / 1000

    @property
    def dedup_window(self) -> float:
        """The queue's stored dedup window, in seconds."""
        o = _capi.spool_options(size=ctypes.sizeof(_capi.spool_options))
        _check(_lib.spool_get_options(self._handle(), ctypes.byref(o)))
        return float(o.dedup_window_ms) / 1000

    @property
    def keep_acked(self) -> float:
        """The queue's stored keep_acked (replay after ack), in seconds; 0: off."""
        o = _capi.spool_options(size=ctypes.sizeof(_capi.spool_options))
        _check(_lib.spool_get_options(self._handle(), ctypes.byref(o)))
        return float(o.keep_acked_ms) / 1000

    # -- sending

    @staticmethod
    def _send_options(delay: float, sync: bool, wait_for_room: float,
                      attributes: Optional[Attributes], dedup_id: Union[str, bytes, None],
                      priority: Optional[int], group: Union[str, bytes, None],
                      keep: list[Any]) -> _capi.spool_send_options:
        """The C send options; what their pointers point into is appended to ``keep``."""
        so = _capi.spool_send_options()
        _lib.spool_send_options_init_size(ctypes.byref(so), ctypes.sizeof(so))
        so.delay_ms = _ms(delay, "delay")
        so.durability = 1 if sync else 0
        so.wait_for_room_ms = _ms(wait_for_room, "wait_for_room")
        so.attributes, so.attribute_count = _c_attributes(attributes, keep)
        so.dedup_id, so.dedup_id_len = _c_dedup_id(dedup_id, keep)
        so.has_priority, so.priority = _c_priority(priority)
        so.group, so.group_len = _c_group(group, keep)
        return so

    def send(self, payload: Payload, *, delay: float = 0.0, sync: bool = False,
             wait_for_room: float = 0.0, attributes: Optional[Attributes] = None,
             dedup_id: Union[str, bytes, None] = None, priority: Optional[int] = None,
             group: Union[str, bytes, None] = None) -> SentId:
        """Appends a message (bytes, or str sent as UTF-8); returns its id (ids increase), a
        :class:`SentId`.
        ``delay``: receivable only after this many seconds. ``sync``: return only once on
        disk. ``wait_for_room``: at a back-pressure limit, wait up to this long for room
        before raising QueueFull. ``attributes``: str keys, bytes or str values, returned
        with the message (see :data:`Attributes` for the bounds). ``dedup_id`` (str or
        bytes, 1 to 128 bytes): if a message with this id was sent within the queue's dedup
        window, nothing is queued and that message's id is returned, with ``.duplicate``
        True. ``priority``: 0 (most urgent) to 255; receive takes the most urgent ready
        message first (None: :data:`DEFAULT_PRIORITY`). ``group`` (str or bytes, 1 to 128
        bytes): the messages of one ordered group are received one at a time, in send order,
        the next only once the one before is acked, dead-lettered or dropped (None: no
        group). Raises TooLarge, QueueFull, NoSpace, ReadOnly, IoError, InvalidArgument (bad
        attributes, dedup id, priority or group, naming the key and the bound)."""
        data = _bytes(payload)
        keep: list[Any] = []
        so = self._send_options(delay, sync, wait_for_room, attributes, dedup_id, priority, group,
                                keep)
        dup = ctypes.c_int()
        so.duplicate = ctypes.pointer(dup)
        out = ctypes.c_uint64()
        _check(_lib.spool_send(self._handle(), data, len(data), ctypes.byref(so),
                               ctypes.byref(out)))
        return SentId(out.value, dup.value != 0)

    def send_batch(self, payloads: Iterable[Union[Payload, SendItem]], *, delay: float = 0.0,
                   sync: bool = False, wait_for_room: float = 0.0,
                   attributes: Optional[Attributes] = None,
                   priority: Optional[int] = None,
                   group: Union[str, bytes, None] = None) -> list[SentId]:
        """All or nothing: queues every message with consecutive ids, or none. Much cheaper
        per message than send() in a loop. ``attributes``, ``priority`` and ``group`` go on
        every message (a group's are received one at a time in the batch's order). An
        element may be a :class:`SendItem` with attributes (added to the shared ones, its
        own winning for a key in both), a dedup id, and a priority and a group (each winning
        over the shared one) of its own; the id returned for a duplicate (of an earlier send, or of an
        earlier item of this batch) is the first message's, with ``.duplicate`` True."""
        items = list(payloads)
        n = len(items)
        if n == 0:
            return []
        ids = (ctypes.c_uint64 * n)()
        keep: list[Any] = []
        if not any(isinstance(it, SendItem) for it in items):
            datas = [_bytes(p) for p in items]  # type: ignore[arg-type]
            ptrs = (ctypes.c_char_p * n)(*datas)
            lens = (ctypes.c_size_t * n)(*(len(d) for d in datas))
            so = self._send_options(delay, sync, wait_for_room, attributes, None, priority, group,
                                    keep)
            _check(_lib.spool_send_batch(self._handle(), ptrs, lens, n, ctypes.byref(so), ids))
            return [SentId(i) for i in ids]  # no dedup ids: none is a duplicate
        arr = (_capi.spool_send_item * n)()
        dups = (ctypes.c_int * n)()
        for i, it in enumerate(items):
            item = it if isinstance(it, SendItem) else SendItem(it)
            data = _bytes(item.payload)
            keep.append(data)
            merged = {**(attributes or {}), **(item.attributes or {})}
            arr[i].payload = _address(data)
            arr[i].len = len(data)
            arr[i].attributes, arr[i].attribute_count = _c_attributes(merged, keep)
            arr[i].dedup_id, arr[i].dedup_id_len = _c_dedup_id(item.dedup_id, keep)
            arr[i].has_priority, arr[i].priority = _c_priority(
                priority if item.priority is None else item.priority)
            arr[i].group, arr[i].group_len = _c_group(group if item.group is None else item.group,
                                                      keep)
            arr[i].duplicate = ctypes.cast(ctypes.addressof(dups) + i * ctypes.sizeof(ctypes.c_int),
                                           _capi.c_int_p)
        so = self._send_options(delay, sync, wait_for_room, None, None, None, None, keep)
        _check(_lib.spool_send_items(self._handle(), arr, n, ctypes.sizeof(_capi.spool_send_item),
                                     ctypes.byref(so), ids))
        return [SentId(ids[i], dups[i] != 0) for i in range(n)]

    @property
    def durable_id(self) -> int:
        """The durable watermark: every message with an id <= this is on disk."""
        return int(_lib.spool_durable_id(self._handle()))

    # -- receiving

    def _batch(self, ptr: "ctypes._Pointer[_capi.spool_message]", n: int) -> list[Message]:
        try:
            return [Message(self, ptr[i], self._attributes(ptr, i), self._priority(ptr, i),
                            self._group(ptr, i))
                    for i in range(n)]
        finally:
            _lib.spool_messages_free(ptr)

    @staticmethod
    def _attributes(ptr: "ctypes._Pointer[_capi.spool_message]", i: int) -> dict[str, bytes]:
        attrs = ctypes.POINTER(_capi.spool_attribute)()
        n = ctypes.c_size_t()
        _check(_lib.spool_message_attributes(ptr, i, ctypes.byref(attrs), ctypes.byref(n)))
        # A key decodes with surrogateescape, which cannot fail: a stored key is not always
        # UTF-8 (a send refuses one, a forged record may hold one), and a decode error here
        # came after the receive had leased the whole batch (issue 48).
        return {attrs[k].key.decode(errors="surrogateescape"):
                ctypes.string_at(attrs[k].value, attrs[k].value_len)
                for k in range(n.value)}

    @staticmethod
    def _priority(ptr: "ctypes._Pointer[_capi.spool_message]", i: int) -> int:
        p = ctypes.c_int()
        _check(_lib.spool_message_priority(ptr, i, ctypes.byref(p)))
        return p.value

    @staticmethod
    def _group(ptr: "ctypes._Pointer[_capi.spool_message]", i: int) -> Optional[bytes]:
        g = ctypes.c_void_p()
        n = ctypes.c_size_t()
        _check(_lib.spool_message_group(ptr, i, ctypes.byref(g), ctypes.byref(n)))
        return ctypes.string_at(g.value, n.value) if g.value else None

    def receive(self, max: int = 1, *, visibility: Optional[float] = None,
                wait: float = 0.0) -> list[Message]:
        """Leases up to ``max`` messages for ``visibility`` seconds (None: the queue's
        default). With ``wait`` > 0, sleeps (GIL released) until a message is receivable or
        ``wait`` seconds pass, woken at once by a send from any process. Returns [] when
        nothing was receivable in time."""
        if max < 1:
            raise ValueError("max must be >= 1")
        vis = 0 if visibility is None else _ms(visibility, "visibility")
        if visibility is not None and vis == 0:
            raise ValueError("visibility must be at least 1 ms (None: the queue's default)")
        ptr = ctypes.POINTER(_capi.spool_message)()
        n = ctypes.c_size_t()
        # A long poll waits in slices of at most _POLL_SLICE seconds: Python runs signal
        # handlers only between calls, so a Ctrl-C (KeyboardInterrupt) comes within a slice
        # instead of at the end of the wait. A send still wakes the slice under way at once.
        left = _ms(wait, "wait")
        deadline = time.monotonic() + left / 1000
        while True:
            code = _lib.spool_receive(self._handle(), max, vis, min(left, _POLL_SLICE_MS),
                                      ctypes.byref(ptr), ctypes.byref(n))
            if code != Empty.code:
                break
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return []
        _check(code)
        return self._batch(ptr, n.value)

    def receive_id(self, id: int, *, visibility: Optional[float] = None) -> Message:
        """Leases message ``id`` if it is receivable now. Raises NotFound (gone) or Empty
        (leased, delayed, or blocked behind an earlier message of its group)."""
        ptr = ctypes.POINTER(_capi.spool_message)()
        vis = 0 if visibility is None else _ms(visibility, "visibility")
        _check(_lib.spool_receive_id(self._handle(), id, vis, ctypes.byref(ptr)))
        return self._batch(ptr, 1)[0]

    def peek(self, max: int = 10) -> list[Message]:
        """Up to ``max`` messages in id order, without receiving them (no receipts)."""
        ptr = ctypes.POINTER(_capi.spool_message)()
        n = ctypes.c_size_t()
        _check(_lib.spool_peek(self._handle(), max, ctypes.byref(ptr), ctypes.byref(n)))
        return self._batch(ptr, n.value) if n.value else []

    # -- settling, by receipt

    def ack(self, receipt: str, *, sync: bool = False) -> None:
        """Deletes the message the receipt names. Raises LeaseLost, NotFound, InvalidArgument."""
        _check(_lib.spool_ack(self._handle(), _cstr(receipt.encode(), "a receipt"), 1 if sync else 0))

    def ack_batch(self, receipts: Sequence[str], *, sync: bool = False) -> list[Optional[Error]]:
        """Acks many receipts at once (as SQS's DeleteMessageBatch): one append, one sync.
        Returns, for each receipt in order, None if it was acked, else the error ack would
        have raised (LeaseLost; NotFound, also for a receipt given twice; InvalidArgument).
        Raises only when the call failed as a whole, acking nothing (ReadOnly, IoError...)."""
        encoded = [_cstr(r.encode(), "a receipt") for r in receipts]
        arr = (ctypes.c_char_p * len(encoded))(*encoded)
        codes = (ctypes.c_int * len(encoded))()
        rc = _lib.spool_ack_batch(self._handle(), arr, len(encoded), 1 if sync else 0, codes)
        if rc not in (0, LeaseLost.code, NotFound.code, InvalidArgument.code):
            _raise(rc)
        return [None if c == 0 else _ERRORS.get(c, Error)(f"receipt {r!r}: {_lib.spool_code_name(c).decode()}", c)
                for r, c in zip(receipts, codes)]

    def nack(self, receipt: str, *, delay: float = 0.0) -> None:
        """Makes the message receivable again after ``delay`` seconds. Errors as ack."""
        _check(_lib.spool_nack(self._handle(), _cstr(receipt.encode(), "a receipt"), _ms(delay, "delay")))

    def extend(self, receipt: str, visibility: float) -> None:
        """Renews the lease to end ``visibility`` seconds from now. Errors as ack."""
        _check(_lib.spool_extend(self._handle(), _cstr(receipt.encode(), "a receipt"), _ms(visibility, "visibility")))

    def remove(self, id: int, *, sync: bool = False) -> None:
        """Deletes message ``id`` without a receipt, whatever its state, as an ack would (a
        receipt still held for it then raises NotFound), but for good: :meth:`replay` never
        sends a deleted message again. Raises NotFound if it is not in the queue."""
        _check(_lib.spool_remove(self._handle(), id, 1 if sync else 0))

    def bind_leases(self) -> None:
        """Binds the leases this Queue takes from now on to this process: if it dies, they
        return to ready at once instead of after their visibility."""
        _check(_lib.spool_bind_leases(self._handle()))

    # -- the worker loop

    def messages(self, *, batch: int = 1, visibility: Optional[float] = None, wait: float = 1.0,
                 idle_timeout: Optional[float] = None, renew: bool = True,
                 max_lifetime: float = 3600.0, auto_ack: bool = True) -> Iterator[Message]:
        """Yields messages for as long as they come, renewing each one's lease while the
        loop's body processes it::

            for msg in q.messages(idle_timeout=10):
                process(msg.payload)

        - ``renew``: a lease keeper (a C++ thread of libspool, no GIL involved) extends the
          lease every visibility/3 to ``visibility`` from now, for at most ``max_lifetime``
          seconds, and binds the lease to this process (killed, the message is ready again
          at once).
        - ``auto_ack``: when the body finishes without settling the message itself (ack or
          nack), it is acked as the loop asks for the next one. If the lease was lost in the
          meantime, ``msg.lease_lost`` is set and the loop goes on (another consumer has it).
        - If the loop ends early (``break``, an exception in the body) or the generator is
          closed, the message in hand and those not yet yielded are nacked, so they are
          retried at once: ack before ``break`` what you finished.
        - ``idle_timeout``: stop after this many seconds without a message (None: never).
        """
        vis = self.visibility if visibility is None else visibility
        idle = 0.0
        pending: list[Message] = []
        try:
            while True:
                got = self.receive(batch, visibility=vis, wait=wait)
                if not got:
                    idle += wait
                    if idle_timeout is not None and idle >= idle_timeout:
                        return
                    continue
                idle = 0.0
                pending = got
                if renew:
                    for m in pending:
                        keeper = ctypes.c_void_p()
                        interval = max(1, _ms(vis / 3, "visibility"))
                        _check(_lib.spool_keeper_start(
                            self._handle(), m.receipt.encode(), interval, _ms(vis, "visibility"),
                            _ms(max_lifetime, "max_lifetime"), ctypes.byref(keeper)))
                        m._keeper = keeper.value
                while pending:
                    m = pending[0]
                    yield m
                    pending.pop(0)
                    m._stop_keeper()
                    if auto_ack and not m.settled:
                        try:
                            m.ack()
                        except LeaseLost:
                            m.lease_lost = True
        finally:
            for m in pending:
                m._stop_keeper()
                if not m.settled and self._h is not None and os.getpid() == self._pid:
                    try:
                        m.nack()
                    except Error:
                        pass  # lost or gone: nothing of ours to give back

    # -- inspecting and maintaining

    def stats(self) -> Stats:
        """The queue's counters."""
        s = _capi.spool_stats(size=ctypes.sizeof(_capi.spool_stats))
        _check(_lib.spool_get_stats(self._handle(), ctypes.byref(s)))
        return Stats(s.ready, s.in_flight, s.delayed, s.dead, s.oldest_ready_age_s, s.sent_total,
                     s.acked_total, s.dead_lettered_total, s.expired_total, s.nacked_total,
                     s.bytes, s.bytes_on_disk, s.segments, s.next_id, s.dedup_ids,
                     s.kept_acked, s.kept_acked_bytes, s.blocked, bool(s.paused))

    def sync(self) -> None:
        """Makes every write so far durable, whatever the sync policy."""
        _check(_lib.spool_sync(self._handle()))

    def pause(self) -> None:
        """Stops delivery (sends are still accepted) until resume(); stored in the queue's
        log, so it holds across restarts (docs/operations.md)."""
        _check(_lib.spool_pause(self._handle()))

    def resume(self) -> None:
        """Delivers again, and wakes every waiting receiver."""
        _check(_lib.spool_resume(self._handle()))

    def release(self, id: int) -> None:
        """Ends the lease of message ``id`` now: it is ready again at once."""
        _check(_lib.spool_release(self._handle(), id))

    def purge(self) -> int:
        """Removes every message; returns how many."""
        n = ctypes.c_uint64()
        _check(_lib.spool_purge(self._handle(), ctypes.byref(n)))
        return n.value

    def compact(self) -> dict[str, int]:
        """Reclaims the disk of acked messages now."""
        r = _capi.spool_compact_result()
        _check(_lib.spool_compact(self._handle(), ctypes.byref(r)))
        return {"segments_removed": r.segments_removed, "messages_copied": r.messages_copied,
                "bytes_freed": r.bytes_freed}

    def verify(self, repair: bool = False) -> list[str]:
        """fsck: the problems found (and repairs made), one line each; [] when sound."""
        problems = ctypes.c_size_t()
        report = ctypes.c_void_p()
        _check(_lib.spool_verify(self._handle(), 1 if repair else 0, ctypes.byref(problems),
                                 ctypes.byref(report)))
        try:
            text = ctypes.string_at(report.value).decode() if report.value else ""
        finally:
            _lib.spool_free(report)
        return [line for line in text.splitlines() if line]

    def dead_letters(self) -> "Queue":
        """The dead-letter queue (dir/dlq), a Queue that closes with this one."""
        h = ctypes.c_void_p()
        _check(_lib.spool_dead_letters(self._handle(), ctypes.byref(h)))
        assert h.value is not None  # set by a call that succeeded
        return Queue._borrowed(self, h.value)

    def redrive(self, max: int = 1 << 30, *, subscription: Optional[str] = None) -> int:
        """Moves up to ``max`` dead letters back into this queue as new messages; returns how
        many. Each goes back to the view it died in only: one of a subscription (marked
        spool.dead.subscription) to that subscription alone, one of the queue's own view
        to that view; one whose subscription was removed stays. On a subscription's handle,
        only that subscription's. With ``subscription``: only the dead letters of that
        subscription, from any handle."""
        n = ctypes.c_uint64()
        if subscription is None:
            _check(_lib.spool_redrive(self._handle(), max, ctypes.byref(n)))
        else:
            _check(_lib.spool_redrive_subscription(self._handle(), max,
                                                   _dead_letters_of(subscription), ctypes.byref(n)))
        return n.value

    def peek_dead_letters(self, max: int = 10, *, subscription: Optional[str] = None) -> list[Message]:
        """Up to ``max`` dead letters in dead-letter id order, without receiving them (ids
        are the dead-letter queue's; the spool.dead.* attributes say where each came from).
        With ``subscription``: only those dead-lettered from that subscription (this reads
        every dead letter's record). None: every dead letter."""
        ptr = ctypes.POINTER(_capi.spool_message)()
        n = ctypes.c_size_t()
        _check(_lib.spool_peek_dead_letters(self._handle(), _dead_letters_of(subscription), max,
                                            ctypes.byref(ptr), ctypes.byref(n)))
        return self.dead_letters()._batch(ptr, n.value) if n.value else []

    def purge_dead_letters(self, *, subscription: Optional[str] = None) -> int:
        """Deletes the dead letters (with ``subscription``: only those dead-lettered from that
        subscription); returns how many."""
        n = ctypes.c_uint64()
        _check(_lib.spool_purge_dead_letters(self._handle(), _dead_letters_of(subscription),
                                             ctypes.byref(n)))
        return n.value

    def replay(self, since: float, until: float = 0,
               to: Optional[Union[str, "os.PathLike[str]"]] = None) -> dict[str, int]:
        """Replay after ack: sends the messages acked between ``since`` and ``until`` seconds
        ago again as new messages (into this queue, or the existing queue ``to``), each with
        its attributes plus spool.replay.original_id and spool.replay.acked_at. Returns
        {"replayed": N, "missing": M} (M: acked in the window, removed by compaction)."""
        n = ctypes.c_uint64()
        missing = ctypes.c_uint64()
        dest = _cstr(os.fsencode(to), "the queue path") if to is not None else None
        _check(_lib.spool_replay(self._handle(), _ms(since, "since"), _ms(until, "until"), dest,
                                 ctypes.byref(n), ctypes.byref(missing)))
        return {"replayed": n.value, "missing": missing.value}

    # -- subscriptions

    @property
    def subscription(self) -> Optional[str]:
        """The subscription this handle reads; None for the queue's own view."""
        return self._subscription

    def add_subscription(self, name: str, from_start: bool = False, *, max_receives: int = 0) -> None:
        """Adds subscription ``name``: a reader of this queue's stream that gets every
        message sent from now on (with ``from_start``, also every message in the queue now)
        from the one stored copy, with leases and acks of its own; open it with
        ``Queue(path, subscription=name)``. Names are 1 to 48 characters of
        [A-Za-z0-9._-], not "default"; at most 16 at once. InvalidArgument for a bad name,
        one that exists or a 17th. ``max_receives``: its own, so a message is dead-lettered
        from this subscription alone on the receive after its max_receives-th delivery
        there (0: the queue's max_receives); ValueError outside 0 to 2**32 - 1."""
        if not 0 <= max_receives <= 0xFFFFFFFF:
            raise ValueError(f"max_receives is 0 (the queue's) to {0xFFFFFFFF}, not {max_receives}")
        _check(_lib.spool_add_subscription_max_receives(self._handle(), _subscription_name(name),
                                                        1 if from_start else 0, max_receives))

    def remove_subscription(self, name: str) -> None:
        """Removes subscription ``name`` and its state (NotFound if there is none); a handle
        reading it gets NotFound at its next call."""
        _check(_lib.spool_remove_subscription(self._handle(), _subscription_name(name)))

    def subscriptions(self) -> list[Subscription]:
        """The queue's subscriptions, from any handle of it."""
        subs = ctypes.POINTER(_capi.spool_subscription_info)()
        n = ctypes.c_size_t()
        _check(_lib.spool_subscriptions(self._handle(), ctypes.byref(subs), ctypes.byref(n)))
        try:
            return [Subscription(name=(subs[i].name or b"").decode(errors="replace"),
                                 from_id=subs[i].from_id, messages=subs[i].messages,
                                 in_flight=subs[i].in_flight, max_receives=subs[i].max_receives)
                    for i in range(n.value)]
        finally:
            _lib.spool_free(subs)

    def __repr__(self) -> str:
        state = "closed" if self._h is None else "open"
        sub = f" subscription={self._subscription!r}" if self._subscription is not None else ""
        return f"<spool.Queue {self._dir!r}{sub} {state}>"

    def __len__(self) -> int:
        """The messages in the queue, not yet acked: ready, in flight, delayed and blocked
        (not the dead letters). A snapshot: other processes change it at once."""
        s = self.stats()
        return s.ready + s.in_flight + s.delayed + s.blocked

    def __bool__(self) -> bool:
        # With __len__, an empty queue would be false: `if q:` means "is this a queue".
        return True

