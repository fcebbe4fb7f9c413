"""Read a ``.tflite`` model on the host: inputs, outputs and precision from its flatbuffer.

Nothing is executed here; the schema module that ships inside ``ai-edge-litert`` (the
``tflite`` extra) parses the file. A TFLite model runs on the device as it is: edgekit does not
re-quantize it, so its precision is what its compute ops consume (int8 weights -> "int8").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from edgekit.errors import ModelError
from edgekit.fsutil import sha256_file
from edgekit.tensorspec import IOSpec, given_shape, shape_overrides

FORMAT = "tflite"
SUFFIX = ".tflite"
_IDENTIFIER = b"TFL3"  # flatbuffer file identifier, bytes 4..8 of every TFLite model

# TensorType -> numpy dtype name (schema.fbs); anything else is refused by name.
_DTYPES = {
    0: "float32",
    1: "float16",
    2: "int32",
    3: "uint8",
    4: "int64",
    6: "bool",
    7: "int16",
    9: "int8",
    10: "float64",
    12: "uint64",
    15: "uint32",
    16: "uint16",
}
_INT8_TYPES = (3, 9)  # UINT8, INT8
# Ops whose weights (input 1) decide the model's precision.
_COMPUTE_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV", "BATCH_MATMUL", "CONV_3D")


@dataclass
class TfliteModel:
    """A loaded ``.tflite`` (a ``modelio.Model``, like the ONNX ``LoadedModel``)."""

    format: ClassVar[str] = FORMAT

    path: Path
    sha256: str
    inputs: tuple[IOSpec, ...]  # concrete shapes
    outputs: tuple[IOSpec, ...]  # -1 where dynamic
    sidecar: object  # modelio.Sidecar
    precision: str  # "int8" | "fp32"
    ops: dict  # builtin op name -> count
    weights_dtype: str | None = None  # "float16" for fp16-stored weights (dequantized at load)
    opset: int = 0
    model: None = None  # no ONNX graph: nothing can quantize or analyze it

    @property
    def name(self) -> str:
        return self.path.stem


def is_tflite(path: Path) -> bool:
    """A .tflite file name, or a file whose flatbuffer identifier says TFLite."""
    if path.suffix.lower() == SUFFIX:
        return True
    try:
        with open(path, "rb") as fh:
            return fh.read(8)[4:8] == _IDENTIFIER
    except OSError:
        return False


def load_tflite(path: Path, raw: bytes, shapes: dict[str, tuple[int, ...]] | None, sidecar) -> TfliteModel:
    """Check and read the TFLite flatbuffer ``raw`` (the bytes of ``path``); ``sidecar``: its
    ``modelio.Sidecar``. Every failure is a ModelError (or UsageError) with a hint."""
    if len(raw) < 8 or raw[4:8] != _IDENTIFIER:
        raise ModelError(
            f"not a TFLite model (no TFL3 flatbuffer identifier): {path}",
            "convert the model to .tflite (LiteRT converter) and check the file copied whole",
        )
    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError:
        raise ModelError(
            "reading a .tflite model needs the ai-edge-litert package on this machine",
            "install it: pip install 'edgekit[tflite]' (or pip install ai-edge-litert)",
        ) from None
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    try:
        model = schema.Model.GetRootAs(raw, 0)
        if model.SubgraphsLength() < 1:
            raise ModelError(f"TFLite model {path} has no subgraph", "re-export the model")
        graph = model.Subgraphs(0)
        tensors = [graph.Tensors(i) for i in range(graph.TensorsLength())]
        ops: dict[str, int] = {}
        precision = "fp32"
        fp16_weights = False
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            # Builtin codes past 127 live in BuiltinCode; older files only fill the deprecated byte.
            name = names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
            ops[name] = ops.get(name, 0) + 1
            if name in _COMPUTE_OPS and op.InputsLength() > 1 and tensors[op.Inputs(1)].Type() in _INT8_TYPES:
                precision = "int8"
            if name == "DEQUANTIZE" and tensors[op.Inputs(0)].Type() == 1:
                fp16_weights = True
        specs_in = [_tensor(tensors[graph.Inputs(i)]) for i in range(graph.InputsLength())]
        specs_out = [_tensor(tensors[graph.Outputs(i)]) for i in range(graph.OutputsLength())]
    except ModelError:
        raise
    except Exception:  # a truncated or corrupt flatbuffer fails anywhere inside the reader
        raise ModelError(
            f"TFLite model {path} is corrupt or truncated",
            "re-export the model and check the file copied whole",
        ) from None
    if not specs_in:
        raise ModelError(f"TFLite model {path} has no inputs", "re-export the model with its input tensors")

    wanted = shape_overrides(sidecar.shapes, shapes, [name for name, *_ in specs_in])
    inputs = []
    for name, shape, signature, dtype in specs_in:
        if dtype is None:
            raise ModelError(f"input '{name}' of {path} has a tensor type edgekit cannot feed", "use a model with numeric inputs")
        if name in wanted:
            shape = given_shape(name, wanted[name], signature)
        inputs.append(IOSpec(name, tuple(max(1, d) for d in shape), dtype))
    outputs = tuple(IOSpec(name, tuple(d if s > 0 else -1 for d, s in zip(shape, sig)), dtype or "unknown") for name, shape, sig, dtype in specs_out)
    return TfliteModel(
        path=path,
        sha256=sha256_file(path),
        inputs=tuple(inputs),
        outputs=outputs,
        sidecar=sidecar,
        precision=precision,
        ops=ops,
        weights_dtype="float16" if fp16_weights else None,
    )


def _tensor(t) -> tuple[str, tuple[int, ...], tuple[int, ...], str | None]:
    """(name, shape, shape signature (-1 = dynamic), numpy dtype or None)."""
    name = t.Name().decode("utf-8", errors="replace")
    shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
    signature = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
    return name, shape, signature, _DTYPES.get(t.Type())
