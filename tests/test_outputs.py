"""Outputs never clobber (issue 26 item 3): an output path is a new path or a regular file, written
to a temp name beside it and renamed; a device node, FIFO, socket or symlink there is refused (exit 3)
and left as it was; a write that fails (disk full, ``> /dev/full``) is an error, never a success."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from edgekit.errors import OutputPathError
from edgekit.fsutil import atomic_path, check_output_dir, write_bytes_atomic
from tests.conftest import EXAMPLES, assert_one_line_error

DIGITS = EXAMPLES / "digits" / "digits_cnn.onnx"
ROOT = os.geteuid() == 0


def _make(kind: str, path: Path) -> None:
    if kind == "chardev":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "symlink":
        (path.parent / "target.txt").write_text("keep me\n")
        path.symlink_to("target.txt")
    elif kind == "dangling":
        path.symlink_to("nowhere.txt")


def _kind(path: Path) -> str:
    mode = os.lstat(path).st_mode
    for test, kind in ((stat.S_ISCHR, "chardev"), (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symlink")):
        if test(mode):
            return kind
    return "other"


KINDS = [pytest.param("chardev", marks=pytest.mark.skipif(not ROOT, reason="mknod needs root")), "fifo", "socket", "symlink", "dangling"]
COMMANDS = {
    "results-export": ["results", "export", "-o", "{out}"],
    "report": ["report", "1", "-o", "{out}"],
    "quantize": ["quantize", str(DIGITS), "-o", "{out}"],
    "ci-junit": ["ci", "-c", "nope.toml", "--junit", "{out}"],
    "ci-summary": ["ci", "-c", "nope.toml", "--summary", "{out}"],
    "ci-report": ["ci", "-c", "nope.toml", "--report", "{out}"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", KINDS)
def test_a_special_output_path_is_refused_and_left_alone(cli, tmp_path, kind, command):
    out = tmp_path / "out"
    _make(kind, out)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = cli(*(a.format(out="out") for a in COMMANDS[command]))
    assert_one_line_error(r, 3, "output path out is a ")
    assert _kind(out) == ("symlink" if kind == "dangling" else kind)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a temp file or a replacement was left"
    if kind == "symlink":
        assert (tmp_path / "target.txt").read_text() == "keep me\n"


@pytest.mark.skipif(not ROOT, reason="mknod needs root")
def test_the_issue_repro_mknod_null_then_export(cli, tmp_path):
    _make("chardev", tmp_path / "null")
    r = cli("results", "export", "-o", "./null")
    assert_one_line_error(r, 3, "is a character device, not a regular file")
    assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode)


@pytest.mark.parametrize("command", ["results-export", "quantize", "ci-junit"])
def test_dev_full_as_output_fails_with_exit_3(cli, command):
    r = cli(*(a.format(out="/dev/full") for a in COMMANDS[command]))
    assert_one_line_error(r, 3, "output path /dev/full is a character device")


@pytest.mark.parametrize("args", [["results", "export"], ["profiles", "list"], ["profiles", "list", "--json"]])
def test_stdout_to_dev_full_fails_with_exit_3(tmp_path, args):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "edgekit", *args], stdout=full, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "CI": "1"}, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == ["error: cannot write to standard output: No space left on device", "hint: free space on the disk that stdout goes to, or use -o FILE"]


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling", "file"])
def test_deploy_bundle_dir_must_be_a_real_directory(cli, tmp_path, kind):
    out = tmp_path / "bundle"
    (tmp_path / "real").mkdir()
    if kind == "file":
        out.write_text("x")
    elif kind == "symlink":
        out.symlink_to("real")
    else:
        _make(kind, out)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = cli("deploy", DIGITS, "--no-bench", "--no-quantize", "-o", "bundle")
    assert_one_line_error(r, 3, "bundle output bundle is ")
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not any((tmp_path / "real").iterdir())
    assert out.read_text() == "x" if kind == "file" else _kind(out) == ("fifo" if kind == "fifo" else "symlink")
    with pytest.raises(OutputPathError):
        check_output_dir(out)


def test_a_write_error_inside_atomic_path_is_an_output_error_and_leaves_nothing(tmp_path):
    (tmp_path / "out.json").write_text("old\n")
    with pytest.raises(OutputPathError, match="cannot write .*out.json: No space left on device"):
        with atomic_path(tmp_path / "out.json") as tmp:
            tmp.write_text("half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    assert (tmp_path / "out.json").read_text() == "old\n"


def test_a_target_that_turns_into_a_fifo_while_we_work_is_not_replaced(tmp_path):
    out = tmp_path / "out.bin"
    with pytest.raises(OutputPathError, match="is a FIFO"):
        with atomic_path(out) as tmp:
            tmp.write_bytes(b"data")
            os.mkfifo(out)  # someone else made it meanwhile: checked again just before the rename
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_regular_files_and_new_paths_are_still_replaced(tmp_path):
    write_bytes_atomic(tmp_path / "new.bin", b"1")
    (tmp_path / "old.bin").write_bytes(b"old")
    write_bytes_atomic(tmp_path / "old.bin", b"2")
    assert (tmp_path / "new.bin").read_bytes() == b"1" and (tmp_path / "old.bin").read_bytes() == b"2"
