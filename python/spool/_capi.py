"""ctypes declarations of libspool's C API (include/spool/spool.h).

Private: use the classes of the ``spool`` package. The library is found as
``$SPOOL_LIBRARY`` (a path), else through ``ctypes.util.find_library("spool")`` (the
dynamic linker's cache, which ``ldconfig`` refreshes), else, for the package ``meson
install`` wrote, in the directory meson installed the library into (``_install.LIBDIR``),
else as ``libspool.so.0`` on the dynamic linker's search path (``LD_LIBRARY_PATH``).

The library is loaded with ``ctypes.CDLL``, which releases the GIL for the whole of every
call: a long poll (``spool_receive`` with a wait) blocks only its own thread. PyDLL would
hold the GIL and must not be used.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint32,
                    c_uint64, c_void_p)

c_int_p = POINTER(c_int)


class spool_options(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("visibility_ms", c_uint64),
        ("max_receives", c_uint32),
        ("sync", c_int),
        ("sync_interval_ms", c_uint64),
        ("segment_size", c_uint64),
        ("max_payload", c_uint64),
        ("retention_max_age_ms", c_uint64),
        ("retention_max_bytes", c_uint64),
        ("max_ready", c_uint64),
        ("max_bytes", c_uint64),
        ("create", c_int),
        ("dedup_window_ms", c_uint64),  # since 0.2.0
        ("keep_acked_ms", c_uint64),  # since 0.2.0
    ]


class spool_attribute(ctypes.Structure):
    _fields_ = [
        ("key", c_char_p),
        ("value", c_void_p),
        ("value_len", c_size_t),
    ]


# What a send gives a message besides its payload: the tail of spool_send_options (since
# 0.2.0) and of spool_send_item.
_MESSAGE_EXTRAS = [
    ("attributes", POINTER(spool_attribute)),
    ("attribute_count", c_size_t),
    ("dedup_id", c_void_p),
    ("dedup_id_len", c_size_t),
    ("has_priority", c_int),
    ("priority", c_int),
    ("duplicate", c_int_p),
    ("group", c_void_p),
    ("group_len", c_size_t),
]


class spool_send_options(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("delay_ms", c_uint64),
        ("durability", c_int),
        ("wait_for_room_ms", c_uint64),
    ] + _MESSAGE_EXTRAS


class spool_send_item(ctypes.Structure):
    _fields_ = [("payload", c_void_p), ("len", c_size_t)] + _MESSAGE_EXTRAS


class spool_message(ctypes.Structure):
    _fields_ = [
        ("id", c_uint64),
        ("payload", c_void_p),
        ("payload_len", c_size_t),
        ("receive_count", c_uint32),
        ("enqueued_ns", c_int64),
        ("receipt", c_char_p),
    ]


class spool_stats(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("ready", c_uint64),
        ("in_flight", c_uint64),
        ("delayed", c_uint64),
        ("dead", c_uint64),
        ("oldest_ready_age_s", c_double),
        ("sent_total", c_uint64),
        ("acked_total", c_uint64),
        ("dead_lettered_total", c_uint64),
        ("expired_total", c_uint64),
        ("nacked_total", c_uint64),
        ("bytes", c_uint64),
        ("bytes_on_disk", c_uint64),
        ("segments", c_uint64),
        ("next_id", c_uint64),
        ("dedup_ids", c_uint64),  # since 0.2.0
        ("kept_acked", c_uint64),  # since 0.2.0
        ("kept_acked_bytes", c_uint64),  # since 0.2.0
        ("blocked", c_uint64),  # since 0.2.0
        ("paused", c_uint64),
    ]


class spool_subscription_info(ctypes.Structure):
    _fields_ = [
        ("name", c_char_p),
        ("from_id", c_uint64),  # spool.h's `from`, a Python keyword
        ("messages", c_uint64),
        ("in_flight", c_uint64),
        ("max_receives", c_uint32),
    ]


class spool_compact_result(ctypes.Structure):
    _fields_ = [
        ("segments_removed", c_uint64),
        ("messages_copied", c_uint64),
        ("bytes_freed", c_uint64),
    ]


def _find() -> str:
    path = os.environ.get("SPOOL_LIBRARY")
    if path:
        return path
    found = ctypes.util.find_library("spool")
    if found:
        return found
    try:
        from . import _install  # type: ignore[attr-defined]  # only in what meson installed
        beside = os.path.join(_install.LIBDIR, "libspool.so.0")
        if os.path.exists(beside):
            return beside
    except ImportError:
        pass
    return "libspool.so.0"


def _load() -> ctypes.CDLL:
    name = _find()
    try:
        lib = ctypes.CDLL(name)  # CDLL: the GIL is released during each call
    except OSError as e:
        if os.environ.get("SPOOL_LIBRARY"):
            advice = "SPOOL_LIBRARY names it: set it to the path of an installed libspool.so.0"
        else:
            advice = ("install it (`apt install libspool0`, or `meson install` from the source tree); "
                      "if it is installed, run `sudo ldconfig` so the dynamic linker finds it, or set "
                      "LD_LIBRARY_PATH to its directory, or SPOOL_LIBRARY to its path")
        raise ImportError(f"spool: cannot load the C library {name!r} ({e}): {advice}") from e
    q = c_void_p
    msg_pp = POINTER(POINTER(spool_message))
    sigs = {
        "spool_code_name": (c_char_p, [c_int]),
        "spool_last_error": (c_char_p, []),
        # The *_init_size functions, given ctypes.sizeof of these Structures (spool.h's
        # init macros are not reachable from ctypes).
        "spool_options_init_size": (None, [POINTER(spool_options), c_size_t]),
        "spool_open": (c_int, [c_char_p, POINTER(spool_options), POINTER(c_void_p)]),
        "spool_open_subscription": (c_int, [c_char_p, POINTER(spool_options), c_char_p,
                                            POINTER(c_void_p)]),
        "spool_close": (None, [q]),
        "spool_dir": (c_char_p, [q]),
        "spool_get_options": (c_int, [q, POINTER(spool_options)]),
        "spool_send_options_init_size": (None, [POINTER(spool_send_options), c_size_t]),
        "spool_send": (c_int, [q, c_char_p, c_size_t, POINTER(spool_send_options),
                               POINTER(c_uint64)]),
        "spool_send_batch": (c_int, [q, POINTER(c_char_p), POINTER(c_size_t), c_size_t,
                                     POINTER(spool_send_options), POINTER(c_uint64)]),
        "spool_send_items": (c_int, [q, POINTER(spool_send_item), c_size_t, c_size_t,
                                     POINTER(spool_send_options), POINTER(c_uint64)]),
        "spool_durable_id": (c_uint64, [q]),
        "spool_receive": (c_int, [q, c_size_t, c_uint64, c_uint64, msg_pp, POINTER(c_size_t)]),
        "spool_receive_id": (c_int, [q, c_uint64, c_uint64, msg_pp]),
        "spool_peek": (c_int, [q, c_size_t, msg_pp, POINTER(c_size_t)]),
        "spool_messages_free": (None, [POINTER(spool_message)]),
        "spool_message_attributes": (c_int, [POINTER(spool_message), c_size_t,
                                             POINTER(POINTER(spool_attribute)),
                                             POINTER(c_size_t)]),
        "spool_message_priority": (c_int, [POINTER(spool_message), c_size_t, c_int_p]),
        "spool_message_group": (c_int, [POINTER(spool_message), c_size_t, POINTER(c_void_p),
                                        POINTER(c_size_t)]),
        "spool_free": (None, [c_void_p]),
        "spool_ack": (c_int, [q, c_char_p, c_int]),
        "spool_ack_batch": (c_int, [q, POINTER(c_char_p), c_size_t, c_int, POINTER(c_int)]),
        "spool_remove": (c_int, [q, c_uint64, c_int]),
        "spool_nack": (c_int, [q, c_char_p, c_uint64]),
        "spool_extend": (c_int, [q, c_char_p, c_uint64]),
        "spool_bind_leases": (c_int, [q]),
        "spool_bind": (c_int, [q, c_char_p]),
        "spool_keeper_start": (c_int, [q, c_char_p, c_uint64, c_uint64, c_uint64,
                                       POINTER(c_void_p)]),
        "spool_keeper_status": (c_int, [c_void_p]),
        "spool_keeper_renewals": (c_uint64, [c_void_p]),
        "spool_keeper_free": (None, [c_void_p]),
        "spool_get_stats": (c_int, [q, POINTER(spool_stats)]),
        "spool_workers_needed": (c_uint64, [POINTER(spool_stats), c_double, c_double]),
        "spool_sync": (c_int, [q]),
        "spool_purge": (c_int, [q, POINTER(c_uint64)]),
        "spool_pause": (c_int, [q]),
        "spool_resume": (c_int, [q]),
        "spool_release": (c_int, [q, c_uint64]),
        "spool_compact": (c_int, [q, POINTER(spool_compact_result)]),
        "spool_verify": (c_int, [q, c_int, POINTER(c_size_t), POINTER(c_void_p)]),
        "spool_dead_letters": (c_int, [q, POINTER(c_void_p)]),
        "spool_redrive": (c_int, [q, c_size_t, POINTER(c_uint64)]),
        "spool_redrive_subscription": (c_int, [q, c_size_t, c_char_p, POINTER(c_uint64)]),
        "spool_peek_dead_letters": (c_int, [q, c_char_p, c_size_t, msg_pp, POINTER(c_size_t)]),
        "spool_purge_dead_letters": (c_int, [q, c_char_p, POINTER(c_uint64)]),
        "spool_add_subscription_max_receives": (c_int, [q, c_char_p, c_int, c_uint32]),
        "spool_remove_subscription": (c_int, [q, c_char_p]),
        "spool_subscriptions": (c_int, [q, POINTER(POINTER(spool_subscription_info)),
                                        POINTER(c_size_t)]),
        "spool_replay": (c_int, [q, c_uint64, c_uint64, c_char_p, POINTER(c_uint64), POINTER(c_uint64)]),
    }
    for fn, (restype, argtypes) in sigs.items():
        f = getattr(lib, fn)
        f.restype = restype
        f.argtypes = argtypes
    return lib


lib = _load()
