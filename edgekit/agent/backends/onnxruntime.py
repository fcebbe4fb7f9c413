"""ONNX Runtime on the CPU: all graph optimizations, CPUExecutionProvider."""

from __future__ import annotations

import sys

from .. import AgentFailure


class Session:
    def __init__(self, session, version: str) -> None:
        self._session = session
        self.version = version

    def run(self, feeds: dict):
        return self._session.run(None, feeds)


def load(model_path: str, threads: int | None, options: dict | None = None, workdir: str | None = None) -> Session:
    try:
        import onnxruntime as ort
    except ImportError as exc:
        if getattr(exc, "name", None) == "onnxruntime":
            raise AgentFailure(
                f"onnxruntime is not installed on the device (for {sys.executable})",
                f"install it there ({sys.executable} -m pip install onnxruntime) or bench a "
                "variant whose backend the device has",
            ) from None
        raise AgentFailure(
            f"onnxruntime is installed on the device but does not import: {exc}",
            "install a build of onnxruntime (and numpy) that matches the device's Python and CPU",
        ) from None
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: warnings would drown the agent's own messages
    if threads:
        opts.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(model_path, sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own exception classes (Fail, InvalidGraph, ...)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AgentFailure(
            f"onnxruntime {ort.__version__} cannot load {model_path}: {first}",
            "check the model with onnx.checker on the host; a newer onnxruntime on the device "
            "may be needed for its opset",
        ) from None
    return Session(session, ort.__version__)
