"""`edgekit version` (and `edgekit --version`): edgekit, ekrt and the runtimes on this host."""

from __future__ import annotations

from edgekit.cli import common
from edgekit.cli.output import Output


def show_version(json_: bool = False) -> None:
    from edgekit.versions import version_lines, versions

    out = Output()
    doc = versions()
    if json_:
        out.json(doc)
    else:
        for line in version_lines(doc):
            out.line(line)


def version(json_: common.Json = False) -> None:
    """Show the versions of edgekit, its int8 runtime ekrt (kernels built, ISA it runs) and the
    runtimes installed on this host (a dash: not installed).

    \b
    Examples:
      edgekit --version
      edgekit version --json | jq -r .runtimes.onnxruntime
    """
    show_version(json_)
