"""Options shared by several commands, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli.output import Output
from edgekit.quantize.calib import METHODS, Preprocess

Target = Annotated[str, typer.Option("--target", "-t", help="Target profile name or path to a profile TOML.")]
Shape = Annotated[
    list[str] | None,
    typer.Option("--shape", help="Concrete shape for a dynamic input, NAME:D0,D1,... (repeatable).", metavar="NAME:DIMS"),
]
Calib = Annotated[
    Path | None,
    typer.Option("--calib", help="Calibration data: .npz/.npy of stacked samples, a folder of .npz, or a folder of images."),
]
Eval = Annotated[Path | None, typer.Option("--eval", help="Held-out data for the fp32-vs-int8 report (same formats as --calib).")]
Labels = Annotated[Path | None, typer.Option("--labels", help="Class labels (.npy of ints) for the --eval samples: reports accuracy.")]
Method = Annotated[str, typer.Option("--method", help=f"Calibration method: {', '.join(METHODS)}.")]
Exclude = Annotated[list[str] | None, typer.Option("--exclude", help="Keep this node in float (repeatable).", metavar="NODE")]
PreprocessOpt = Annotated[
    str | None,
    typer.Option("--preprocess", help="Image preprocessing, e.g. 'scale=1/255,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,color=rgb'."),
]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON document to stdout.")]
Backend = Annotated[str | None, typer.Option("--backend", help="Force a backend (onnxruntime, native, openvino, tensorrt, tflite).")]


def output(json_mode: bool) -> Output:
    return Output("json" if json_mode else "human")


def preprocess(text: str | None) -> Preprocess | None:
    return Preprocess.parse(text) if text else None


def check_method(method: str) -> str:
    from edgekit.errors import UsageError

    if method not in METHODS:
        raise UsageError(f"unknown calibration method '{method}'", f"choose one of: {', '.join(METHODS)}")
    return method


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
