"""CRC32C (Castagnoli) of chunk data, as TensorChunk.crc32c carries it.

Uses google-crc32c (hardware CRC32C, a C extension from PyPI) when importable; otherwise a
table-driven pure-Python fallback that is correct but slow (~10 MB/s): fine for tests, not for
real transfers, so a warning is printed once.
"""

import sys

try:
    import google_crc32c as _g

    def crc32c(data):
        return _g.value(bytes(data) if not isinstance(data, (bytes, bytearray)) else data)

    FAST = True
except ImportError:  # pragma: no cover - depends on the environment
    _TABLE = []
    for _i in range(256):
        _c = _i
        for _ in range(8):
            _c = (_c >> 1) ^ (0x82F63B78 if _c & 1 else 0)
        _TABLE.append(_c)
    _warned = False

    def crc32c(data):
        global _warned
        if not _warned and len(data) > (1 << 20):
            print("dfa: google-crc32c not installed; pure-Python CRC32C is slow "
                  "(python3 -m pip install google-crc32c)", file=sys.stderr)
            _warned = True
        c = 0xFFFFFFFF
        t = _TABLE
        for b in bytes(data):
            c = t[(c ^ b) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF

    FAST = False
