"""Calls of edgekit.api a type checker must flag, one per line marked ``# flagged``: the test reads
those marks and wants an error on each of those lines and nowhere else."""

from __future__ import annotations

from edgekit import api

M = "examples/digits/digits_cnn.onnx"


def misuse() -> None:
    api.deploy(M, iterations="many")  # flagged: a count is an int
    api.deploy(M, max_drop="1")  # flagged: points are a number
    api.deploy(M, tagret="local")  # flagged: no such option
    api.deploy(M, "local")  # flagged: options are keyword-only
    api.deploy(M, warmup="later")  # flagged: a count or "auto"
    api.plan(M, goal="push")  # flagged: quantize, bundle or deploy
    api.quantize(M)  # flagged: quantize needs its output path
    api.bench(M, variants=["int8"], threads=2.5)  # flagged: threads are a count
    x: str = api.plan(M).backend  # a correct line among them: not flagged
    print(x)
