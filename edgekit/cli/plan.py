"""`edgekit plan`: what a deploy would do, decided once, printed before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgekit.cli import common
from edgekit.cli.output import Output


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)


def plan(
    model: Annotated[Path, typer.Argument(help="The float ONNX model (or a .tflite, which runs as it is).", show_default=False)],
    target: common.Target = "local",
    device: Annotated[str, typer.Option("--device", "-d", help="Device to deploy to.")] = "local",
    backend: common.Backend = None,
    no_quantize: Annotated[bool, typer.Option("--no-quantize", help="Plan a float deploy.")] = False,
    calib: common.Calib = None,
    method: common.Method = "minmax",
    exclude: common.Exclude = None,
    shape: common.Shape = None,
    json_out: common.Json = False,
) -> None:
    """Show the plan for MODEL on a target: backend, precision, scheme, float nodes and steps.

    Example:

        edgekit plan examples/digits/digits_cnn.onnx --target rpi5
    """
    from edgekit.deploy import DeployRequest, prepare_deploy
    from edgekit.modelio import parse_shape_overrides

    o = common.output(json_out)
    req = DeployRequest(
        model=model,
        target=target,
        device=device,
        backend=backend,
        quantize=not no_quantize,
        calib=calib,
        method=common.check_method(method),
        exclude=tuple(exclude or ()),
        shapes=parse_shape_overrides(shape),
    )
    prep = prepare_deploy(req)
    doc = prep.plan.to_dict()
    if json_out:
        o.json(doc)
        return
    print_plan(o, doc)


def print_plan(o: Output, doc: dict) -> None:
    o.line(f"model     {doc['model']}  ({doc['model_path']})")
    o.line("inputs    " + ", ".join(f"{i['name']} {i['dtype']}{i['shape']}" for i in doc["inputs"]))
    o.line(f"target    {doc['profile']}: {doc['profile_description']}")
    o.line(f"device    {doc['device']}")
    o.line(f"backend   {doc['backend']}")
    o.line(f"precision {doc['precision']}")
    if doc["scheme"]:
        s = doc["scheme"]
        o.line(
            f"scheme    {s['name']}: activations {s['activation_dtype']} "
            f"{'symmetric' if s['activation_symmetric'] else 'asymmetric'}, weights int8 symmetric "
            f"{'per-channel' if s['per_channel'] else 'per-tensor'}; {doc['method']} calibration on {doc['calibration']}"
        )
        n = doc["nodes"]
        o.line(
            f"nodes     {n.get('int8', 0)} int8, {n.get('fused', 0)} fused, {n.get('passthrough', 0)} pass-through, {n.get('float', 0)} float"
        )
    for b in doc["skipped_backends"]:
        o.line(f"skipped   {b['backend']}: {b['reason']}")
    for note in doc["notes"]:
        o.line(f"note      {note}")
    if doc["float_nodes"]:
        o.table(["node", "op", "stays float because"], [[f["name"], f["op"], f["reason"]] for f in doc["float_nodes"]])
    o.table(["#", "step", "detail"], [[i + 1, s["name"], s["detail"]] for i, s in enumerate(doc["steps"])])
