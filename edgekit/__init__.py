"""edgekit: take an ONNX model to an edge device — quantize, plan, push, benchmark, gate."""

__version__ = "0.1.0"
