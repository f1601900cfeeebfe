"""Readers of the trajectory files flowkit writes, for the tests (shared by tests/targets and tests/cli)."""

import struct

import numpy as np


def read_dcd(path):
    """A minimal reader of the CHARMM DCD files OpenMM writes (little-endian, no box): `(frames, atoms, 3)` in A."""
    data = path.read_bytes()
    size, magic, frames = struct.unpack_from("<i4si", data, 0)
    assert size == 84 and magic == b"CORD"
    assert struct.unpack_from("<i", data, 88)[0] == 84  # end of the first record
    offset = 92
    (title_bytes,) = struct.unpack_from("<i", data, offset)
    offset += 4 + title_bytes + 4
    size, atoms, end = struct.unpack_from("<3i", data, offset)
    assert size == end == 4
    offset += 12
    out = np.empty((frames, atoms, 3), dtype=np.float32)
    for f in range(frames):
        for axis in range(3):
            (size,) = struct.unpack_from("<i", data, offset)
            assert size == 4 * atoms
            out[f, :, axis] = np.frombuffer(data, "<f4", atoms, offset + 4)
            assert struct.unpack_from("<i", data, offset + 4 + size)[0] == size
            offset += size + 8
    assert offset == len(data)
    return out
