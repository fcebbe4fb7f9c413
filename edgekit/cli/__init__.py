"""The CLI root: wires one module per noun and maps errors to exit codes."""

from __future__ import annotations

import os
import sys

import typer

from edgekit.errors import EXIT_INTERNAL, EXIT_USAGE, EdgekitError

app = typer.Typer(
    name="edgekit",
    help="Take an ONNX model to an edge device: quantize to int8, pick a backend per target, "
    "push, benchmark on the device, gate CI on regressions.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from edgekit.cli.version import show_version

        show_version()
        raise typer.Exit(0)


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                 help="Show edgekit's, ekrt's and the installed runtimes' versions and exit."),
) -> None:
    """Take an ONNX model to an edge device: quantize to int8, pick a backend per target, push,
    benchmark on the device, gate CI on regressions."""


def _register() -> None:
    # Imported here so `import edgekit.cli` stays cheap and the order of --help is fixed.
    from edgekit.cli import (
        bench,
        ci,
        deploy,
        devices,
        plan,
        profiles,
        quantize,
        report,
        results,
        version,
    )

    for command in (quantize.quantize, plan.plan, deploy.deploy, bench.bench):
        app.command(command.__name__)(command)
    app.add_typer(profiles.app, name="profiles")
    app.add_typer(results.app, name="results")
    app.add_typer(devices.app, name="devices")
    app.command("ci")(ci.ci)
    app.command("report")(report.report)
    app.command("version")(version.version)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``edgekit`` console script."""
    from edgekit.cli.output import Output

    _register()
    try:
        app(args=argv, prog_name="edgekit", standalone_mode=False)
    except EdgekitError as exc:
        if os.environ.get("EDGEKIT_DEBUG") == "1":
            raise
        Output().error(exc)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message(), file=sys.stderr)
        else:
            print(f"error: {exc.format_message()}", file=sys.stderr)
            print("hint: run with --help for usage", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # a bug: still say it in one line, full traceback on request
        if os.environ.get("EDGEKIT_DEBUG") == "1":
            raise
        print(f"error: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("hint: this is a bug in edgekit; rerun with EDGEKIT_DEBUG=1 and report the traceback", file=sys.stderr)
        sys.exit(EXIT_INTERNAL)
    sys.exit(0)
