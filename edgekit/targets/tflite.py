"""LiteRT (TensorFlow Lite): runs ``.tflite`` models as they are, with XNNPACK on the CPU.

On the device the agent uses ``tflite_runtime`` or ``ai_edge_litert``, whichever imports.
tflite-runtime (last release 2.14) is built against numpy 1 and cannot run next to numpy 2;
ai-edge-litert works with numpy 2. One Python environment has one numpy, so a device needs
the package that matches its numpy.
"""

from __future__ import annotations

from typing import Any

from edgekit.modelio import LoadedModel
from edgekit.profiles import BackendSpec, Profile
from edgekit.profiles.model import version_tuple
from edgekit.targets.base import Backend, Verdict, runtime_version


class TfliteBackend(Backend):
    name = "tflite"
    scheme = None  # a .tflite model is already built at its precision; edgekit does not requantize it
    formats = ("tflite",)
    runtimes = ("ai_edge_litert", "tflite_runtime")

    def supports(self, model: LoadedModel, profile: Profile, facts: dict | None = None) -> Verdict:
        fmt = model.format
        if fmt not in self.formats:
            return Verdict(False, (f"tflite runs .tflite models, not {fmt} (edgekit does not convert ONNX to TFLite)",))
        verdict = super().supports(model, profile, facts)
        if not verdict.ok:
            if facts is not None and runtime_version(facts, *self.runtimes) is None:
                # preflight's hint provisions it (ai-edge-litert, which works with numpy 2), never a system pip
                return Verdict(False, ("neither ai-edge-litert nor tflite-runtime is installed on the device",), "missing")
            return verdict
        if facts is None:
            return Verdict(True)
        litert = runtime_version(facts, "ai_edge_litert")
        if litert:
            return Verdict(True, (f"the device runs LiteRT through ai-edge-litert {litert}",))
        tflite_runtime = runtime_version(facts, "tflite_runtime")
        numpy = runtime_version(facts, "numpy")
        if numpy and _major(numpy) >= 2:
            return Verdict(
                False,
                (f"tflite-runtime {tflite_runtime} on the device is built for numpy 1 and fails with its numpy {numpy} "
                 "(install ai-edge-litert, which works with numpy 2, or numpy<2)",),
            )
        return Verdict(True, (f"the device runs LiteRT through tflite-runtime {tflite_runtime}",))

    def variant_options(self, spec: BackendSpec | None, precision: str) -> dict[str, Any]:
        return {"xnnpack": True}


def _major(version: str) -> int:
    try:
        return version_tuple(version)[0]
    except ValueError:
        return 0


BACKEND = TfliteBackend()
