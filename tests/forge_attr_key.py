#!/usr/bin/python3
"""Forges a stored message whose attribute key is not one a send accepts (issue 48).

    forge_attr_key.py QUEUE_DIR ID OLD NEW

Rewrites, in place, the attribute key OLD of message ID's MSG record to NEW (same length;
both given as text in which \\xNN stands for a byte, e.g. 'k\\xff') and gives the record a
valid checksum again, as a hostile writer of the queue directory could. A send refuses any
key outside [A-Za-z0-9._-], so only such a record holds one. Run it while no process has the
queue open. Also imported by python/tests (forge_key()).

The record layout is docs/format.md's: a 48-byte record header whose checksum (offset 40)
is XXH3-64 of header bytes 0..39 and the payload, seeded with the segment's salt (offset
16 of the segment header); a MSG with flag EXT starts its payload with the extension, whose
ATTRIBUTE entries hold key_len, key, value. The checksum is libxxhash's (the library spool
links), called through ctypes. Exits 1 with a message if the record or the key is not found.
"""
from __future__ import annotations

import ctypes
import glob
import os
import struct
import sys

RECORD_MAGIC = 0x31525053
SEGMENT_HEADER = 64
RECORD_HEADER = 48
CHECKSUM_OFFSET = 40
TYPE_MSG = 1
FLAG_EXT = 1 << 3
EXT_HEADER = 8
ENTRY_HEADER = 4
ENTRY_ATTRIBUTE = 1

_xxh = ctypes.CDLL("libxxhash.so.0")
_xxh.XXH3_64bits_withSeed.restype = ctypes.c_uint64
_xxh.XXH3_64bits_withSeed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]


def xxh3(data: bytes, seed: int) -> int:
    return int(_xxh.XXH3_64bits_withSeed(data, len(data), seed))


def _key_offset(ext: bytes, key: bytes) -> int:
    """The offset in ``ext`` of attribute key ``key``'s bytes, or -1."""
    (ext_len,) = struct.unpack_from("<I", ext, 0)
    o = EXT_HEADER
    while o + ENTRY_HEADER <= min(ext_len, len(ext)):
        etype, _, n = struct.unpack_from("<BBH", ext, o)
        o += ENTRY_HEADER
        value = ext[o:o + n]
        if etype == ENTRY_ATTRIBUTE and value and value[1:1 + value[0]] == key:
            return o + 1
        o += n
    return -1


def forge_key(qdir: str, msg_id: int, old: bytes, new: bytes) -> None:
    """Rewrites attribute key ``old`` of message ``msg_id`` to ``new`` (same length) and
    recomputes the record's checksum. Raises LookupError if the record or key is absent."""
    if len(old) != len(new):
        raise ValueError("the new key must be as long as the old one")
    for path in sorted(glob.glob(os.path.join(qdir, "segments", "*.seg"))):
        with open(path, "r+b") as f:
            seg = f.read()
            (salt,) = struct.unpack_from("<Q", seg, 16)
            for o in range(SEGMENT_HEADER, len(seg) - RECORD_HEADER + 1, 8):
                magic, length, rtype, flags = struct.unpack_from("<IIBB", seg, o)
                (rid,) = struct.unpack_from("<Q", seg, o + 16)
                if magic != RECORD_MAGIC or rtype != TYPE_MSG or rid != msg_id:
                    continue
                payload = bytearray(seg[o + RECORD_HEADER:o + RECORD_HEADER + length])
                k = _key_offset(bytes(payload), old) if flags & FLAG_EXT else -1
                if k < 0:
                    raise LookupError(f"message {msg_id} has no attribute key {old!r}")
                payload[k:k + len(new)] = new
                checksum = xxh3(seg[o:o + CHECKSUM_OFFSET] + bytes(payload), salt)
                f.seek(o + CHECKSUM_OFFSET)
                f.write(struct.pack("<Q", checksum) + bytes(payload))
                return
    raise LookupError(f"no MSG record of message {msg_id} in {qdir}/segments")


def _bytes_arg(text: str) -> bytes:
    """'k\\xff' -> b'k\\xff': the text's characters as bytes, \\xNN as the byte NN."""
    return text.encode("latin-1").decode("unicode_escape").encode("latin-1")


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(f"usage: {argv[0]} QUEUE_DIR ID OLD NEW", file=sys.stderr)
        return 2
    try:
        forge_key(argv[1], int(argv[2]), _bytes_arg(argv[3]), _bytes_arg(argv[4]))
    except (LookupError, ValueError, OSError) as e:
        print(f"forge_attr_key: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
