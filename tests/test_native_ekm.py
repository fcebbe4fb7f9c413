"""The .ekm writer/reader (docs/ekrt.md, "The .ekm file"): layout, round trip, rejects."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from edgekit.errors import ModelError
from edgekit.targets.native import ekm


def tiny_model() -> ekm.EkmModel:
    m = ekm.EkmModel(arena_size=128)
    x = m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, (1, 4)))
    q = m.add_tensor(ekm.Tensor(ekm.I8, ekm.ARENA, (1, 4), 0.5, -3, offset=0))
    w = m.add_tensor(ekm.Tensor(ekm.I8, ekm.CONST, (2, 4), data=np.arange(8, dtype=np.int8).reshape(2, 4)))
    b = m.add_tensor(ekm.Tensor(ekm.I32, ekm.CONST, (2,), data=np.array([7, -9], np.int32)))
    mu = m.add_tensor(ekm.Tensor(ekm.I32, ekm.CONST, (2,), data=np.array([1 << 30, 1 << 30], np.int32)))
    sh = m.add_tensor(ekm.Tensor(ekm.I32, ekm.CONST, (2,), data=np.array([-1, -2], np.int32)))
    y8 = m.add_tensor(ekm.Tensor(ekm.I8, ekm.ARENA, (1, 2), 0.25, 5, offset=64))
    y = m.add_tensor(ekm.Tensor(ekm.F32, ekm.IO, (1, 2)))
    m.add_op(ekm.QUANTIZE, [x], [q])
    m.add_op(ekm.FULLY_CONNECTED, [q, w, b, mu, sh], [y8], {11: -128, 12: 127})
    m.add_op(ekm.DEQUANTIZE, [y8], [y])
    m.inputs.append((x, "input"))
    m.outputs.append((y, "logits"))
    return m


def test_layout_matches_the_contract():
    buf = ekm.to_bytes(tiny_model())
    assert buf[:4] == b"EKM1"
    version, header_size, flags, file_size, checksum = struct.unpack_from("<IIIQI", buf, 4)
    assert (version, header_size, flags, file_size) == (1, 128, 0, len(buf))
    assert checksum == zlib.crc32(buf[128:])
    n_tensors, n_ops, n_in, n_out = struct.unpack_from("<4I", buf, 28)
    assert (n_tensors, n_ops, n_in, n_out) == (8, 3, 1, 1)
    offsets = struct.unpack_from("<6Q", buf, 48)
    tensors_off, ops_off, io_off, data_off, data_size, arena = offsets
    assert all(o % 64 == 0 for o in offsets[:4]) and arena == 128 and len(buf) % 64 == 0
    assert data_off + data_size == len(buf)
    # tensor 2 (the weight): dtype int8, const, rank 2, dims 2x4, data at a 64-aligned offset
    dtype, storage, rank, *dims = struct.unpack_from("<7I", buf, tensors_off + 2 * 48)
    (w_off,) = struct.unpack_from("<Q", buf, tensors_off + 2 * 48 + 40)
    assert (dtype, storage, rank, dims) == (2, 2, 2, [2, 4, 0, 0]) and w_off % 64 == 0
    assert buf[data_off + w_off: data_off + w_off + 8] == bytes(range(8))
    # tensor 1: scale/zero point
    scale, zp = struct.unpack_from("<fi", buf, tensors_off + 48 + 28)
    assert (scale, zp) == (0.5, -3)
    # op 1: FULLY_CONNECTED with 5 inputs, output 6, act range in params[11..12]
    op = struct.unpack_from("<II8III20i", buf, ops_off + 128)
    assert op[0] == 4 and op[1] == 5 and op[2:7] == (1, 2, 3, 4, 5) and op[11] == 6 and op[12 + 11:12 + 13] == (-128, 127)
    # io names
    tensor, name_len, name_off = struct.unpack_from("<IIQ", buf, io_off + 16)
    assert tensor == 7 and buf[data_off + name_off: data_off + name_off + name_len] == b"logits"


def test_round_trip():
    m = ekm.from_bytes(ekm.to_bytes(tiny_model()))
    assert [op.type for op in m.ops] == [ekm.QUANTIZE, ekm.FULLY_CONNECTED, ekm.DEQUANTIZE]
    assert m.inputs == [(0, "input")] and m.outputs == [(7, "logits")]
    assert m.tensors[1].scale == 0.5 and m.tensors[1].zero_point == -3
    np.testing.assert_array_equal(m.tensors[2].data, np.arange(8).reshape(2, 4))
    np.testing.assert_array_equal(m.tensors[3].data, [7, -9])
    assert m.ops[1].inputs == [1, 2, 3, 4, 5] and m.ops[1].params[12] == 127
    assert ekm.to_bytes(m) == ekm.to_bytes(tiny_model())


def test_save_is_atomic_and_loads(tmp_path):
    path = ekm.save(tiny_model(), tmp_path / "m.ekm")
    assert ekm.load(path).arena_size == 128
    bad = tiny_model()
    bad.tensors[6].offset = 127  # ends past the arena
    with pytest.raises(ModelError, match="arena_size"):
        ekm.save(bad, tmp_path / "bad.ekm")
    assert not (tmp_path / "bad.ekm").exists()


@pytest.mark.parametrize("mutate, needle", [
    (lambda b: b.__setitem__(slice(0, 4), b"EKM2"), "magic"),
    (lambda b: struct.pack_into("<I", b, 4, 2), "version"),
    (lambda b: b.__setitem__(200, b[200] ^ 1), "checksum"),
    (lambda b: b.extend(b"\0" * 64), "file_size"),
])
def test_reader_rejects(mutate, needle):
    buf = bytearray(ekm.to_bytes(tiny_model()))
    mutate(buf)
    with pytest.raises(ModelError, match=needle):
        ekm.from_bytes(bytes(buf))
