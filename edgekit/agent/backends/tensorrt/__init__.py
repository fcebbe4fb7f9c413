"""TensorRT through ``trtexec``: build the engine on the device (cached), then let trtexec time it.

An engine only runs on the GPU, TensorRT version and build flags it was built with, so it is
built here, on the device, from the bundle's ONNX model and kept under
``<workdir>/trt-engines/<key>.engine`` (``engine_key``: model sha256, TensorRT version, GPU/SoC,
flags); an unchanged deploy finds it and skips the build. trtexec runs its own timed loop, so
the session has ``bench(warmup, iterations, duration_s, inputs)`` (the runner's hook for
backends that time themselves) instead of a per-call ``run``: samples are trtexec's
per-iteration host latencies (H2D + GPU compute + D2H) from ``--exportTimes``, layers its
per-layer times from ``--exportProfile``.
Three modules, standard library only: ``probe`` (which TensorRT and trtexec are here),
``trtexec`` (the command builders, the engine cache key and the output parsers: pure functions
the host imports too, so host and device spell trtexec the same way) and ``session`` (the
backend the agent runs). The parsers were checked against real trtexec logs and exports
(TensorRT 8.2 to 10.16, tests/fixtures/trtexec/); no trtexec ran on the machine this was
written on.
"""
