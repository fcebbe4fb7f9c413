"""Backends the agent can time: one module per runtime, imported only when a variant needs it.

A backend module has ``load(model_path: str, threads: int | None, options: dict, workdir: str)
-> session``; ``options`` are the variant's backend options from the manifest and ``workdir``
a directory the backend may keep caches in. The session has ``run(feeds: dict) -> outputs``
and a ``version`` string; optionally ``layers() -> list[dict] | None`` (per-layer times after
the timed loop: name, op, ns, and backend-specific fields) and ``info`` (a JSON dict such as
first-load vs cached-load time or the devices that really executed). The module imports its runtime
inside ``load`` and turns "not installed" into an AgentFailure with an install hint.

A session may also have ``timed(feeds) -> (step, how)``: it binds ``feeds`` to the runtime once
and returns ``step``, a function of no arguments that runs one inference and returns its time in
ns as measured as close to the runtime as it allows (OpenVINO's own per-request latency; ONNX
Runtime's run on pre-bound inputs and outputs), and ``how``, a line saying what that time spans.
The timed loop then measures the runtime and not the agent's Python around it (converting feeds,
building output lists): on a 20 us model that harness was half the figure.

A module with ``STATIC_SHAPES = True`` gets ``options["input_shapes"]`` from the bench: the
variant's inputs whose dims are all known (name -> dims), so that it can compile a model with
dynamic inputs for the shapes it is timed with.
"""

from __future__ import annotations

import importlib

from .. import AgentFailure

# The one list of backends edgekit knows, in the order profiles and messages name them: backend
# name (as in profiles and bundle manifests) -> its module in this package. The host reads it too
# (profiles.BACKENDS; targets finds the host side as edgekit.targets.<name>).
BACKENDS = {
    "native": "native",
    "tensorrt": "tensorrt.session",
    "openvino": "openvino",
    "tflite": "tflite",
    "onnxruntime": "onnxruntime",
    "numpy": "numpy_ref",
}


def load_backend(name: str):
    """The backend module for ``name``; an unknown name is an AgentFailure."""
    module = BACKENDS.get(name)
    if module is None:
        raise AgentFailure(
            f"this agent cannot run backend '{name}' (it runs: {', '.join(sorted(BACKENDS))})",
            "update edgekit on the host (the agent is pushed with it) or bench another variant",
        )
    try:
        return importlib.import_module("." + module, __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{module}":
            raise
        raise AgentFailure(
            f"this agent has no '{name}' backend yet",
            "update edgekit on the host (the agent is pushed with it) or bench another variant",
        ) from None
