"""CRC-32C (Castagnoli), the checksum every HiddenStateChunk and TensorChunk carries.

`google_crc32c` (C, hardware-accelerated) is used when it is installed. Otherwise a numpy
implementation runs: CRC is sequential byte by byte, so the buffer is cut into lanes of LANE bytes,
all lanes advance together (one vectorised table step per 4 bytes, slicing-by-4), and the lane
CRCs are then combined left to right with the linear "append LANE zero bytes" operator:

    raw(r, A ++ B) = Z_len(B)(raw(r, A)) ^ raw(0, B)

where raw is the register update without the final xor and Z_n is linear over GF(2). This runs at
~90 MB/s on one core (a 4 MiB chunk in ~45 ms); the C package is ~100x faster.
"""
from __future__ import annotations

import numpy as np

__all__ = ["crc32c", "IMPLEMENTATION"]

_POLY = 0x82F63B78  # reflected Castagnoli polynomial
LANE = 256  # bytes per lane of the numpy path (a multiple of 4)


def _make_tables() -> np.ndarray:
    """T[k][b]: the register after b followed by k zero bytes (slicing-by-4 tables)."""
    t = np.zeros((4, 256), dtype=np.uint32)
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t[0, b] = c
    for k in range(1, 4):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    return t


_T = _make_tables()


def _advance_words(crc: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Feeds words[:, j] (little-endian uint32) into every lane's register, j = 0, 1, ..."""
    t0, t1, t2, t3 = _T[0], _T[1], _T[2], _T[3]
    for j in range(words.shape[1]):
        c = crc ^ words[:, j]
        crc = t3[c & 0xFF] ^ t2[(c >> 8) & 0xFF] ^ t1[(c >> 16) & 0xFF] ^ t0[c >> 24]
    return crc


def _raw_bytes(crc: int, data: bytes | memoryview) -> int:
    for b in bytes(data):
        crc = int(_T[0][(crc ^ b) & 0xFF]) ^ (crc >> 8)
    return crc


def _zeros_operator(n_bytes: int) -> np.ndarray:
    """Z_n as 4 byte tables: Z_n(x) = Z[0][x & 255] ^ Z[1][(x >> 8) & 255] ^ ..."""
    basis = (np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)
    images = _advance_words(basis, np.zeros((32, n_bytes // 4), dtype=np.uint32))
    z = np.zeros((4, 256), dtype=np.uint32)
    for k in range(4):
        for v in range(256):
            acc = 0
            for bit in range(8):
                if v >> bit & 1:
                    acc ^= int(images[8 * k + bit])
            z[k, v] = acc
    return z


_Z_LANE = _zeros_operator(LANE)


def _crc32c_numpy(data: bytes | bytearray | memoryview) -> int:
    buf = np.frombuffer(data, dtype=np.uint8)
    lanes = buf.size // LANE
    crc = 0xFFFFFFFF
    if lanes:
        words = buf[: lanes * LANE].view("<u4").reshape(lanes, LANE // 4).astype(np.uint32)
        lane_crcs = _advance_words(np.zeros(lanes, dtype=np.uint32), words).tolist()
        z0, z1, z2, z3 = (_Z_LANE[k].tolist() for k in range(4))
        for lc in lane_crcs:
            crc = (z0[crc & 0xFF] ^ z1[(crc >> 8) & 0xFF] ^ z2[(crc >> 16) & 0xFF]
                   ^ z3[crc >> 24] ^ lc)
    crc = _raw_bytes(crc, buf[lanes * LANE:].tobytes())
    return crc ^ 0xFFFFFFFF


try:
    import google_crc32c as _google_crc32c

    def crc32c(data: bytes | bytearray | memoryview) -> int:
        """CRC-32C of data (as in iSCSI and the proto's crc32c fields)."""
        return _google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)

    IMPLEMENTATION = f"google_crc32c ({_google_crc32c.implementation})"
except ImportError:  # pragma: no cover - exercised by the unit test directly
    crc32c = _crc32c_numpy
    IMPLEMENTATION = "numpy"
