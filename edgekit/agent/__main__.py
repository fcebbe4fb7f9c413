"""The agent's command line: ``python agent.pyz bench BUNDLE_DIR --variant NAME ...`` or ``facts``.
(``store ROOT MODE JSON``, the device side of a push, goes straight to ``store.py`` from the
zip's boot stub: it runs twice per push, so it skips this parser.)

Prints exactly one JSON document to stdout. A failure is an ``edgekit.error`` document
(exit 1), so the host can tell "onnxruntime is not installed on the device" from a crash.
While the work runs, file descriptor 1 points at stderr: a runtime that prints to stdout
from C code cannot corrupt the document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback

from . import AGENT_VERSION, SCHEMA, AgentFailure, error_document


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit 2
        raise AgentFailure(f"agent usage: {message}", f"see: {self.prog} --help")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _warmup(text: str):
    if text == "auto":
        return text
    try:
        return _non_negative_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 0, got {text!r}") from None


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agent.pyz", description="edgekit device agent " + AGENT_VERSION)
    sub = parser.add_subparsers(dest="command", metavar="{bench,eval,facts}")
    sub.required = True
    bench = sub.add_parser("bench", help="time one variant of a bundle")
    bench.add_argument("bundle_dir")
    bench.add_argument("--variant", required=True)
    bench.add_argument("--warmup", type=_warmup, default="auto", help="untimed runs, or 'auto': until stable (bounded)")
    bench.add_argument("--iterations", type=_positive_int, default=100)
    bench.add_argument("--duration", type=_positive_float, default=None, help="seconds; replaces --iterations")
    bench.add_argument("--threads", type=_positive_int, default=None)
    bench.add_argument("--profile", action="store_true", help="per-layer times, from a separate pass after the timed loop")
    ev = sub.add_parser("eval", help="run held-out samples through one variant, save its outputs")
    ev.add_argument("bundle_dir")
    ev.add_argument("--variant", required=True)
    ev.add_argument("--samples", required=True, help="the bundle's .npz of stacked inputs")
    ev.add_argument("--output", required=True, help="where to write the outputs (.npz)")
    ev.add_argument("--threads", type=_positive_int, default=None)
    sub.add_parser("facts", help="describe this device")
    # subparsers are built by the parent's class, so they raise AgentFailure too
    return parser


@contextlib.contextmanager
def _stdout_to_stderr():
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout = real_stdout


def _run(args: argparse.Namespace) -> dict:
    from . import facts, runner

    if args.command == "facts":
        return {
            "schema": SCHEMA,
            "kind": "edgekit.facts",
            "agent_version": AGENT_VERSION,
            "device": facts.device_facts(),
            "device_state": facts.device_state(),
            "probe": facts.probe_facts(),  # preflight extras: disk, libc, pip/venv, OpenVINO devices
        }
    if args.command == "eval":
        return runner.evaluate(args.bundle_dir, args.variant, args.samples, args.output, threads=args.threads)
    return runner.bench(
        args.bundle_dir,
        args.variant,
        warmup=args.warmup,
        iterations=args.iterations,
        duration_s=args.duration,
        threads=args.threads,
        profile=args.profile,
    )


def main(argv: list[str] | None = None) -> int:
    rc = 1
    try:
        args = _parser().parse_args(argv)
        with _stdout_to_stderr():
            document = _run(args)
        rc = 0
    except AgentFailure as exc:
        document = error_document(exc.message, exc.hint)
    except Exception as exc:  # a bug or a runtime blowing up: still answer in JSON
        traceback.print_exc(file=sys.stderr)
        document = error_document(
            f"the agent failed: {type(exc).__name__}: {exc}",
            "this is likely a bug in the edgekit agent; its traceback is on the device's stderr",
        )
    sys.stdout.write(json.dumps(document))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
