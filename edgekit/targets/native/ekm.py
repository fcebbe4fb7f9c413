"""The ``.ekm`` file: ekrt's model format (docs/ekrt.md, "The .ekm file"), written and read.

``EkmModel`` is the in-memory form the lowering builds; ``to_bytes``/``save`` lay it out
(header, tensor table, op table, io table, data), ``from_bytes``/``load`` parse and check it
(used by the numpy reference interpreter and the tests). Pure Python + numpy.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgekit.errors import ModelError

MAGIC = b"EKM1"
EKM_VERSION = 1
HEADER_SIZE = 128
TENSOR_SIZE = 48
IO_SIZE = 16
OP_SIZE = 128
ALIGN = 64
MAX_RANK = 4
MAX_OP_INPUTS = 8
N_PARAMS = 20

# dtype
F32, I8, I32 = 1, 2, 3
DTYPE_NUMPY = {F32: np.dtype("<f4"), I8: np.dtype("i1"), I32: np.dtype("<i4")}
# storage
ARENA, CONST, IO = 1, 2, 3

# op types
QUANTIZE = 1
DEQUANTIZE = 2
CONV2D = 3
FULLY_CONNECTED = 4
ADD = 5
MUL = 6
CONCAT = 7
MAXPOOL = 8
AVGPOOL = 9
GLOBAL_AVGPOOL = 10
RESHAPE = 11
TRANSPOSE = 12
RESIZE = 13
LUT = 14
SOFTMAX = 15
PAD = 16
SLICE = 17
LUT_CHANNEL = 18
# the float ops of the islands (docs/ekrt.md "Float islands"); params[0] of F_BINARY / F_UNARY
# picks the function, a float attribute is stored as its float32 bits in an int32 param
F_BINARY = 19
F_UNARY = 20
F_REDUCE = 21
F_MATMUL = 22
F_SOFTMAX = 23
BINARY_FUNCS = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal")
REDUCE_FUNCS = ("ReduceMean", "ReduceSum", "ReduceMax")
UNARY_FUNCS = ("Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Reciprocal", "Neg", "Abs", "Relu", "Erf",
               "HardSigmoid", "HardSwish", "Softplus", "LeakyRelu", "Gelu")
FLOAT_OPS = frozenset({F_BINARY, F_UNARY, F_REDUCE, F_MATMUL, F_SOFTMAX})
OP_NAMES = {
    QUANTIZE: "QUANTIZE", DEQUANTIZE: "DEQUANTIZE", CONV2D: "CONV2D",
    FULLY_CONNECTED: "FULLY_CONNECTED", ADD: "ADD", MUL: "MUL", CONCAT: "CONCAT",
    MAXPOOL: "MAXPOOL", AVGPOOL: "AVGPOOL", GLOBAL_AVGPOOL: "GLOBAL_AVGPOOL",
    RESHAPE: "RESHAPE", TRANSPOSE: "TRANSPOSE", RESIZE: "RESIZE", LUT: "LUT", SOFTMAX: "SOFTMAX",
    PAD: "PAD", SLICE: "SLICE", LUT_CHANNEL: "LUT_CHANNEL", F_BINARY: "F_BINARY", F_UNARY: "F_UNARY",
    F_REDUCE: "F_REDUCE", F_MATMUL: "F_MATMUL", F_SOFTMAX: "F_SOFTMAX",
}


def float_bits(v: float) -> int:
    """A float attribute as the int32 param holding its float32 bits."""
    return int(np.array(v, np.float32).view(np.int32))


def bits_float(p: int) -> np.float32:
    return np.array(p, np.int32).view(np.float32)[()]

# magic, version, header_size, flags, file_size, checksum, n_tensors, n_ops, n_inputs,
# n_outputs, reserved0, tensors/ops/io/data offsets, data_size, arena_size, reserved[32]
_HEADER = struct.Struct("<4sIIIQIIIIIIQQQQQQ32s")
# dtype, storage, rank, dims[4], scale, zero_point, reserved, offset
_TENSOR = struct.Struct("<III4IfiIQ")
_IO = struct.Struct("<IIQ")
# type, n_inputs, inputs[8], n_outputs, outputs[1], params[20]
_OP = struct.Struct("<II8III20i")
assert _HEADER.size == HEADER_SIZE and _TENSOR.size == TENSOR_SIZE
assert _IO.size == IO_SIZE and _OP.size == OP_SIZE


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Tensor:
    """One tensor. ``data`` is set for const tensors; ``offset`` for arena tensors."""

    dtype: int
    storage: int
    dims: tuple[int, ...]
    scale: float = 0.0
    zero_point: int = 0
    offset: int = 0
    data: np.ndarray | None = None
    name: str = ""  # not stored in the file: for messages and the reference interpreter

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) * DTYPE_NUMPY[self.dtype].itemsize


@dataclass
class Op:
    type: int
    inputs: list[int]
    outputs: list[int]
    params: list[int] = field(default_factory=lambda: [0] * N_PARAMS)
    name: str = ""  # not stored: the ONNX node it came from

    @property
    def type_name(self) -> str:
        return OP_NAMES.get(self.type, str(self.type))


@dataclass
class EkmModel:
    tensors: list[Tensor] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    inputs: list[tuple[int, str]] = field(default_factory=list)  # (tensor index, name)
    outputs: list[tuple[int, str]] = field(default_factory=list)
    arena_size: int = 0

    def add_tensor(self, tensor: Tensor) -> int:
        self.tensors.append(tensor)
        return len(self.tensors) - 1

    def add_op(self, type_: int, inputs: list[int], outputs: list[int],
               params: dict[int, int] | None = None, name: str = "") -> Op:
        full = [0] * N_PARAMS
        for i, v in (params or {}).items():
            full[i] = int(v)
        op = Op(type_, list(inputs), list(outputs), full, name)
        self.ops.append(op)
        return op


def _check_model(m: EkmModel) -> None:
    """Structural checks the writer owes the loader (not the per-op semantic checks)."""
    n = len(m.tensors)
    for i, t in enumerate(m.tensors):
        where = f"tensor {i} {t.name!r}"
        if t.dtype not in DTYPE_NUMPY or t.storage not in (ARENA, CONST, IO):
            raise ModelError(f"ekm: {where} has dtype {t.dtype} / storage {t.storage}",
                             "this is a lowering bug; report it with the model")
        if not 0 <= len(t.dims) <= MAX_RANK or any(d < 1 or d >= 2**32 for d in t.dims):
            raise ModelError(f"ekm: {where} has dims {t.dims}", "ekrt tensors are rank 0..4 with dims >= 1")
        if t.storage == CONST:
            if t.data is None or t.data.size != int(np.prod(t.dims, dtype=np.int64)):
                raise ModelError(f"ekm: const {where} has no data of its shape", "this is a lowering bug")
        if t.storage == ARENA and t.offset + t.nbytes > m.arena_size:
            raise ModelError(f"ekm: {where} ends past arena_size {m.arena_size}", "this is a lowering bug")
        if t.storage == IO and t.dtype != F32:
            raise ModelError(f"ekm: io {where} is not float32", "graph inputs/outputs are float32")
    for j, op in enumerate(m.ops):
        if op.type not in OP_NAMES or not 0 <= len(op.inputs) <= MAX_OP_INPUTS or len(op.outputs) != 1:
            raise ModelError(f"ekm: op {j} ({op.type_name}) has {len(op.inputs)} inputs / {len(op.outputs)} outputs",
                             "ops take 0..8 inputs and give 1 output")
        if any(not 0 <= k < n for k in (*op.inputs, *op.outputs)):
            raise ModelError(f"ekm: op {j} ({op.type_name}) names a tensor out of range", "this is a lowering bug")
        if len(op.params) != N_PARAMS or any(not -(2**31) <= p < 2**31 for p in op.params):
            raise ModelError(f"ekm: op {j} ({op.type_name}) params out of int32 range", "this is a lowering bug")
    for k, _ in (*m.inputs, *m.outputs):
        if not 0 <= k < n or m.tensors[k].storage != IO:
            raise ModelError(f"ekm: io entry names tensor {k}, not an io tensor", "this is a lowering bug")


def to_bytes(m: EkmModel) -> bytes:
    """The model laid out as a version-1 ``.ekm`` file."""
    _check_model(m)
    # data section: every const 64-byte aligned, then the io names
    data = bytearray()
    const_offsets: dict[int, int] = {}
    for i, t in enumerate(m.tensors):
        if t.storage == CONST:
            data += b"\0" * (align(len(data)) - len(data))
            const_offsets[i] = len(data)
            data += np.ascontiguousarray(t.data, dtype=DTYPE_NUMPY[t.dtype]).tobytes()
    names: list[tuple[int, int]] = []
    for _, name in (*m.inputs, *m.outputs):
        raw = name.encode("utf-8")
        names.append((len(data), len(raw)))
        data += raw
    data += b"\0" * (align(len(data)) - len(data))

    tensors_offset = align(HEADER_SIZE)
    ops_offset = align(tensors_offset + TENSOR_SIZE * len(m.tensors))
    io_offset = align(ops_offset + OP_SIZE * len(m.ops))
    data_offset = align(io_offset + IO_SIZE * (len(m.inputs) + len(m.outputs)))
    file_size = data_offset + len(data)

    out = bytearray(file_size)
    for i, t in enumerate(m.tensors):
        dims = list(t.dims) + [0] * (MAX_RANK - len(t.dims))
        is_i8 = t.dtype == I8
        offset = const_offsets.get(i, t.offset if t.storage == ARENA else 0)
        _TENSOR.pack_into(out, tensors_offset + i * TENSOR_SIZE, t.dtype, t.storage, len(t.dims), *dims,
                          float(t.scale) if is_i8 else 0.0, int(t.zero_point) if is_i8 else 0, 0, offset)
    for j, op in enumerate(m.ops):
        ins = list(op.inputs) + [0] * (MAX_OP_INPUTS - len(op.inputs))
        _OP.pack_into(out, ops_offset + j * OP_SIZE, op.type, len(op.inputs), *ins,
                      len(op.outputs), op.outputs[0], *op.params)
    for k, ((tensor, _), (name_off, name_len)) in enumerate(zip((*m.inputs, *m.outputs), names)):
        _IO.pack_into(out, io_offset + k * IO_SIZE, tensor, name_len, name_off)
    out[data_offset:] = data
    checksum = zlib.crc32(memoryview(out)[HEADER_SIZE:]) & 0xFFFFFFFF
    _HEADER.pack_into(out, 0, MAGIC, EKM_VERSION, HEADER_SIZE, 0, file_size, checksum,
                      len(m.tensors), len(m.ops), len(m.inputs), len(m.outputs), 0,
                      tensors_offset, ops_offset, io_offset, data_offset, len(data), m.arena_size, b"\0" * 32)
    return bytes(out)


def save(m: EkmModel, path: str | Path) -> Path:
    """Write ``m`` to ``path`` atomically."""
    from edgekit.fsutil import write_bytes_atomic

    path = Path(path)
    write_bytes_atomic(path, to_bytes(m))
    return path


def _bad(what: str) -> ModelError:
    return ModelError(f"not a valid .ekm file: {what}", "re-create it with edgekit (the lowering writes .ekm files)")


def from_bytes(buf: bytes) -> EkmModel:
    """Parse and check a ``.ekm`` file (header fields, bounds, checksum, tables)."""
    if len(buf) < HEADER_SIZE:
        raise _bad(f"{len(buf)} bytes, shorter than the {HEADER_SIZE}-byte header")
    (magic, version, header_size, _flags, file_size, checksum, n_tensors, n_ops, n_inputs, n_outputs,
     _r0, tensors_offset, ops_offset, io_offset, data_offset, data_size, arena_size, _r) = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise _bad(f"magic {magic!r}, expected {MAGIC!r}")
    if version != EKM_VERSION:
        raise _bad(f"version {version}, this edgekit reads {EKM_VERSION}")
    if header_size != HEADER_SIZE:
        raise _bad(f"header_size {header_size}")
    if file_size != len(buf):
        raise _bad(f"file_size {file_size} but the file has {len(buf)} bytes")
    if zlib.crc32(memoryview(buf)[HEADER_SIZE:]) & 0xFFFFFFFF != checksum:
        raise _bad("checksum mismatch")

    def section(name: str, off: int, size: int) -> None:
        if off < HEADER_SIZE or off + size > file_size:
            raise _bad(f"{name} [{off}, {off + size}) outside the file")

    section("tensors", tensors_offset, n_tensors * TENSOR_SIZE)
    section("ops", ops_offset, n_ops * OP_SIZE)
    section("io", io_offset, (n_inputs + n_outputs) * IO_SIZE)
    section("data", data_offset, data_size)

    m = EkmModel(arena_size=arena_size)
    for i in range(n_tensors):
        dtype, storage, rank, d0, d1, d2, d3, scale, zp, _res, offset = _TENSOR.unpack_from(
            buf, tensors_offset + i * TENSOR_SIZE)
        if dtype not in DTYPE_NUMPY or storage not in (ARENA, CONST, IO) or rank > MAX_RANK:
            raise _bad(f"tensor {i}: dtype {dtype} storage {storage} rank {rank}")
        dims = (d0, d1, d2, d3)[:rank]
        if any(d == 0 for d in dims):
            raise _bad(f"tensor {i}: zero dim in {dims}")
        t = Tensor(dtype, storage, dims, scale, zp, offset, name=f"t{i}")
        if storage == CONST:
            if offset + t.nbytes > data_size:
                raise _bad(f"const tensor {i} outside data")
            start = data_offset + offset
            t.data = np.frombuffer(buf, DTYPE_NUMPY[dtype], int(np.prod(dims, dtype=np.int64)), start).reshape(dims)
        elif storage == ARENA and offset + t.nbytes > arena_size:
            raise _bad(f"arena tensor {i} outside arena_size")
        m.tensors.append(t)
    for j in range(n_ops):
        vals = _OP.unpack_from(buf, ops_offset + j * OP_SIZE)
        type_, n_in = vals[0], vals[1]
        inputs, n_out, outputs, params = list(vals[2:10]), vals[10], [vals[11]], list(vals[12:32])
        if type_ not in OP_NAMES or n_in > MAX_OP_INPUTS or n_out != 1:
            raise _bad(f"op {j}: type {type_} n_inputs {n_in} n_outputs {n_out}")
        inputs = inputs[:n_in]
        if any(k >= n_tensors for k in (*inputs, *outputs)):
            raise _bad(f"op {j}: tensor index out of range")
        m.ops.append(Op(type_, inputs, outputs, params, name=f"{OP_NAMES[type_]}#{j}"))
    for k in range(n_inputs + n_outputs):
        tensor, name_len, name_off = _IO.unpack_from(buf, io_offset + k * IO_SIZE)
        if tensor >= n_tensors or m.tensors[tensor].storage != IO or name_off + name_len > data_size:
            raise _bad(f"io entry {k}")
        name = bytes(buf[data_offset + name_off: data_offset + name_off + name_len]).decode("utf-8", "replace")
        m.tensors[tensor].name = name
        (m.inputs if k < n_inputs else m.outputs).append((tensor, name))
    return m


def load(path: str | Path) -> EkmModel:
    return from_bytes(Path(path).read_bytes())


__all__ = [
    "ADD", "ARENA", "AVGPOOL", "BINARY_FUNCS", "CONCAT", "CONST", "CONV2D", "DEQUANTIZE", "EKM_VERSION", "F32",
    "FLOAT_OPS", "F_BINARY", "F_MATMUL", "F_REDUCE", "F_SOFTMAX", "F_UNARY", "UNARY_FUNCS", "bits_float", "float_bits",
    "FULLY_CONNECTED", "GLOBAL_AVGPOOL", "I8", "I32", "IO", "LUT", "MAXPOOL", "MUL", "OP_NAMES",
    "QUANTIZE", "RESHAPE", "RESIZE", "SOFTMAX", "TRANSPOSE", "EkmModel", "Op", "Tensor",
    "from_bytes", "load", "save", "to_bytes",
]
