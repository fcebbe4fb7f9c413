"""The agent's command line: ``python agent.pyz bench BUNDLE_DIR --variant NAME ...``, ``eval``,
``facts``, or ``serve``. (``store ROOT MODE JSON``, the device side of a push, and ``lock OP
LOCKDIR ...``, the device lock's, go straight to ``store.py`` / ``lock.py`` from the zip's boot
stub, skipping this parser; ``serve`` answers them too.)

``serve`` answers many commands in one process, so a deploy starts Python and opens an SSH
channel once instead of once per step: each stdin line is a request ``{"argv": [...]}``, each
stdout line the answer ``{"status": EXIT, "document": DOC}``. Every request runs in a forked
child, so a runtime that crashes takes only its request down (the status says which signal),
and what a bench measures (peak RSS, imports) is what a fresh ``agent.pyz bench`` measured: the
parent never imports a runtime. stdin's EOF ends the server.

Every other command prints exactly one JSON document to stdout. A failure is an ``edgekit.error`` document
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
    bench.add_argument("--min-time", type=_positive_float, default=None, help="seconds: at least --iterations and at least this long")
    bench.add_argument("--threads", type=_positive_int, default=None)
    bench.add_argument("--no-thread-probe", action="store_true", help="without --threads: the runtime's default, not probed against one thread")
    bench.add_argument("--profile", action="store_true", help="per-layer times, from a separate pass after the timed loop")
    ev = sub.add_parser("eval", help="run held-out samples through one variant, save its outputs")
    ev.add_argument("bundle_dir")
    ev.add_argument("--variant", required=True)
    ev.add_argument("--samples", required=True, help="the bundle's .npz of stacked inputs")
    ev.add_argument("--output", required=True, help="where to write the outputs (.npz)")
    ev.add_argument("--threads", type=_positive_int, default=None)
    ev.add_argument("--model", default=None, help="a bundle file the variant's backend runs instead (its twin with intermediate tensors exposed)")
    facts = sub.add_parser("facts", help="describe this device")
    facts.add_argument("--no-openvino", action="store_true", help="do not import OpenVINO to list its devices")
    sub.add_parser("serve", help="answer JSON-lines requests on stdin, one forked worker each")
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
            "probe": facts.probe_facts(openvino=not args.no_openvino),  # preflight extras: disk, libc, pip/venv, OpenVINO devices
        }
    if args.command == "eval":
        return runner.evaluate(args.bundle_dir, args.variant, args.samples, args.output, threads=args.threads, model=args.model)
    return runner.bench(
        args.bundle_dir,
        args.variant,
        warmup=args.warmup,
        iterations=args.iterations,
        duration_s=args.duration,
        threads=args.threads,
        probe_threads=not args.no_thread_probe,
        profile=args.profile,
        min_time_s=args.min_time or 0.0,
    )


def _answer(argv: list) -> tuple:
    """(exit code, document) of one command line; ``--lock LOCKDIR TOKEN`` before it: this process
    is the work of the job that holds the device's lock (ended with it if that job dies); then
    ``--lock-ttl SECONDS``: push the lock's expiry that far ahead first, and refuse to run when the
    lock is no longer that job's (an engine without a connection held open, Ansible's, sends it)."""
    if argv[:1] == ["--lock"] and len(argv) >= 3:
        from . import lock

        lockdir, token, argv = argv[1], argv[2], argv[3:]
        if argv[:1] == ["--lock-ttl"] and len(argv) >= 2:
            ttl, argv = argv[1], argv[2:]
            done = lock.answer(["refresh", lockdir, token, ttl])
            if not done.get("done"):
                return 1, error_document(
                    f"the device lock is no longer this job's ({done.get('error') or 'another job broke it, or it expired'})",
                    "run it again; edgekit devices check DEVICE shows who holds the device",
                )
        lock.join(lockdir, token)  # not held (any more): nothing to join, the host's lock check says so
    if argv[:1] in (["store"], ["lock"]):  # a push's and the device lock's steps, their own small protocol
        from . import lock, store

        return 0, (store if argv[0] == "store" else lock).answer(argv[1:])
    try:
        args = _parser().parse_args(argv)
        if args.command == "serve":
            raise AgentFailure("agent usage: serve cannot be requested from serve", "send bench, eval or facts")
        with _stdout_to_stderr():
            return 0, _run(args)
    except AgentFailure as exc:
        return 1, error_document(exc.message, exc.hint, exc.runtime, exc.reason)
    except Exception as exc:  # a bug or a runtime blowing up: still answer in JSON
        traceback.print_exc(file=sys.stderr)
        return 1, error_document(
            f"the agent failed: {type(exc).__name__}: {exc}",
            "this is likely a bug in the edgekit agent; its traceback is on the device's stderr",
        )


def serve(stdin, out) -> int:
    """Answer each request line of ``stdin`` on ``out`` (see the module's docstring)."""
    for line in stdin:
        try:
            argv = json.loads(line)["argv"]
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ValueError("argv is not a list of strings")
        except (ValueError, KeyError, TypeError) as exc:
            answer = {"status": 2, "document": error_document(f"agent serve: bad request: {exc}", "send {\"argv\": [...]} lines")}
        else:
            answer = _fork(argv)
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


def _fork(argv: list) -> dict:
    """Run one command in a child; its exit status (negative: the signal that killed it) and document."""
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the server's loop
        code = 1
        try:
            os.close(r)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)  # the next requests are the server's, not this worker's
            code, document = _answer(argv)
            with os.fdopen(w, "w") as fh:
                fh.write(json.dumps(document))
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        text = fh.read()
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        document = json.loads(text) if text else None
    except ValueError:
        document = None
    return {"status": code, "document": document}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["serve"]:
        out = os.fdopen(os.dup(1), "w")  # the answers' channel; anything else printed goes to stderr
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return serve(sys.stdin, out)
    rc, document = _answer(argv)
    sys.stdout.write(json.dumps(document))
    sys.stdout.write("\n")
    sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
