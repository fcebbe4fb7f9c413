"""Files over SFTP for the SSH transport (``SftpFiles``): atomic uploads hashed on the device
(big ones while they arrive) and resumable from a content-named temp file; downloads; mkdir.
"""
from __future__ import annotations

import contextlib
import hashlib
import posixpath
import shlex
import stat
import struct
from collections import deque
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from edgekit.errors import DeviceError, LinkError, TransportError
from edgekit.fsutil import atomic_path, sha256_file
from edgekit.transport.base import PutProgress, PutStats, part_name
from edgekit.transport.sshconnect import WINDOW_SIZE

# Upload writes are our own pipelined SFTP requests, not SFTPFile.write: that one sends 32 KiB
# requests, each of which spills 29 header bytes into a second SSH packet (twice the packets, and
# paramiko's cost is per packet), and it drains every outstanding request each 100 writes, an
# empty pipe each time. Ours fill whole channel packets, are as large as the server accepts
# (OpenSSH's limits@openssh.com: 255 KiB) and keep IN_FLIGHT bytes outstanding throughout.
MIN_WRITE = 32768  # what every SFTP server takes (draft-ietf-secsh-filexfer: >= 32768 of data)
IN_FLIGHT = 4 << 20  # bytes of write requests awaiting an answer (the channel window caps it too)
WRITE_HEAD = 4 + 1 + 4 + 4 + 8 + 4  # a write request's bytes besides the handle and the data:
# length, type, id, handle length, offset, data length

# The device's hasher is the agent's digest.py, sent as text (the transport never imports the
# agent, and uploads the agent itself with it): "$2" -S -c TEXT PATH [SIZE IDLE].
_DIGEST_PY = (Path(__file__).resolve().parents[1] / "agent" / "digest.py").read_text(encoding="utf-8")

# sha256 of "$1": prints the hex digest, "missing" (exit 0) or "notfile" (exit 3). For big files
# ("$3" = py) the device's Python ("$2", without site: it starts in milliseconds) goes first:
# hashlib uses OpenSSL, 2-5x faster than coreutils where the CPU has SHA instructions. Small
# files, or no Python: sha256sum (on stdin: it escapes odd file names in its output).
HASHER = f"""if [ ! -e "$1" ]; then echo missing; exit 0; fi
if [ ! -f "$1" ]; then echo notfile; exit 3; fi
if [ "$3" = py ] && command -v "$2" >/dev/null 2>&1; then exec "$2" -S -c {shlex.quote(_DIGEST_PY)} "$1"; fi
if command -v sha256sum >/dev/null 2>&1; then exec sha256sum < "$1"; fi
exec "$2" -S -c {shlex.quote(_DIGEST_PY)} "$1"
"""
PY_HASH_MIN = 4 << 20  # from this size on, hash with the device's Python first
# Up to this size an upload is checked by reading it back over SFTP on the same handle (one
# request after the fsync) and hashing here: what the device stored, without starting a hasher
# process there (a few round trips and two process starts per file: most of a small upload).
READBACK_MAX = 256 * 1024


def _pipelines(sftp) -> bool:
    """Does this paramiko's SFTPClient have the internals ``_write_all``/``_read_back`` drive
    (request ids, the table of awaited answers, the raw channel)? Written against paramiko 5.1;
    a release that renames them gets paramiko's own write path instead of a crash."""
    return all(hasattr(sftp, a) for a in ("_lock", "_expecting", "request_number", "_async_request", "_read_response", "sock"))

# A big upload is hashed on the device *while* it arrives: this follower (started right after
# the temp file is opened) reads the file as it grows, so the check costs no second pass after
# the transfer. It gives up after "$4" seconds without growth. No Python: exit 127, hash afterwards.
FOLLOWER = f"""command -v "$1" >/dev/null 2>&1 || exit 127
exec "$1" -S -c {shlex.quote(_DIGEST_PY)} "$2" "$3" "$4"
"""

# Free bytes (POSIX df, 1024-byte blocks) in the file system holding "$1".
DF = """df -Pk "$1" 2>/dev/null | awk 'NR==2 {print $4 * 1024}'"""


class SftpFiles:
    """The file half of an ``SshTransport`` (which owns the connection and runs commands)."""

    def __init__(self, ssh: Any) -> None:
        self.ssh = ssh  # the SshTransport: its connection, watchdog and command runner
        self._sftp = None  # paramiko.SFTPClient, opened on first use
        self._max_write: int | None = None  # the server's largest write request (per SFTP session)

    def detach(self):
        """Forget the SFTP session (the connection is being dropped); it, for closing."""
        sftp, self._sftp = self._sftp, None
        return sftp

    def _sftp_client(self):
        import paramiko

        with self.ssh._lock:
            if self._sftp is not None and self.ssh._transport is not None and self.ssh._transport.is_active():
                return self._sftp
            t = self.ssh.connect()
            try:
                sftp = paramiko.SFTPClient.from_transport(t, window_size=WINDOW_SIZE)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise self.ssh._lost("opening SFTP", exc) from None
            if sftp is None:
                raise TransportError(f"{self.ssh.target.display} refused the SFTP subsystem", "enable 'Subsystem sftp' in the device's sshd_config")
            sftp.get_channel().settimeout(self.ssh.idle_timeout)
            self._sftp, self._max_write = sftp, None
            return sftp

    @contextlib.contextmanager
    def _sftp_op(self, what: str):
        """Map paramiko's link failures to LinkError (and drop the connection)."""
        try:
            yield
        except Exception as exc:
            if isinstance(exc, TransportError) or not self._is_link_failure(exc):
                raise
            raise self.ssh._lost(what, exc) from None

    def _is_link_failure(self, exc: BaseException) -> bool:
        """Did ``exc`` come from the link (as opposed to an SFTP status like "no such file")?"""
        import paramiko

        if isinstance(exc, (paramiko.SSHException, EOFError, TimeoutError, ConnectionError)):
            return True
        if isinstance(exc, OSError) and exc.errno is None:  # paramiko's "Socket is closed" and friends
            t, sftp = self.ssh._transport, self._sftp
            chan = sftp.get_channel() if sftp is not None else None
            return t is None or not t.is_active() or (chan is not None and chan.closed) or self.ssh._stalled
        return False

    def put(self, local: Path, remote: str, digest: str, resume: bool, progress: PutProgress) -> PutStats:
        """``Transport._put``: over SFTP, the hash checked by the device."""
        dest = self.ssh._abs(remote)
        parent = posixpath.dirname(dest)
        size = local.stat().st_size
        tmp = part_name(dest, digest, resume)
        sftp = self._sftp_client()
        offset = 0
        with self._sftp_op(f"uploading {local.name}"):
            self._check_upload_target(sftp, dest, parent)
            if resume:
                with contextlib.suppress(FileNotFoundError):
                    offset = sftp.stat(tmp).st_size or 0
        # what a dropped link left is kept only when the device's hash of it is the local prefix
        if not 0 < offset <= size or self._hash(tmp, offset) != sha256_file(local, offset):
            offset = 0
        sent = 0
        resumed_from = offset
        if offset:
            progress(0, offset)
        follower: dict[str, Any] = {}

        def start_follower() -> None:
            follower["chan"] = self._start_follower(tmp, size)

        for _attempt in range(2):
            follower.clear()
            try:
                moved, got = self._send(sftp, local, tmp, offset, size, progress, opened=start_follower if size >= PY_HASH_MIN else None)
                sent += moved
            except BaseException as exc:
                if follower.get("chan") is not None:
                    with contextlib.suppress(Exception):
                        follower["chan"].close()
                if not resume and not isinstance(exc, LinkError):
                    self._remove_quietly(tmp)
                raise  # a LinkError leaves the temp file: a resumable upload continues from it
            if follower.get("chan") is not None:
                got = self._finish_follower(follower["chan"])
            if got != digest:  # no follower, or it saw something else: hash the file as it is now
                got = self._hash(tmp, size)
            if got == digest:
                break
            if offset > 0:  # what was there before did not fit: start the file over once
                offset = 0
                continue
            self._diagnose_write_failure(tmp, parent, size)
            self._remove_quietly(tmp)
            raise TransportError(f"upload of {local} to {dest} arrived corrupted (sha256 {got} on the device)", "retry; check the device's storage")
        with self._sftp_op(f"renaming {tmp}"):
            try:
                sftp.chmod(tmp, 0o644)
                try:
                    sftp.posix_rename(tmp, dest)
                except OSError as exc:
                    if exc.errno is not None or "not supported" not in str(exc).lower():
                        raise
                    with contextlib.suppress(FileNotFoundError):  # no posix-rename@openssh.com
                        sftp.remove(dest)
                    sftp.rename(tmp, dest)
            except OSError as exc:
                if self._is_link_failure(exc):
                    raise
                self._remove_quietly(tmp)
                raise TransportError(f"cannot move the upload into place at {dest}: {exc.strerror or exc}", "check permissions") from None
        return PutStats(sent, resumed_from)

    def _check_upload_target(self, sftp, dest: str, parent: str) -> None:
        try:
            st = sftp.stat(dest)
        except FileNotFoundError:
            try:
                pst = sftp.stat(parent)
            except FileNotFoundError:
                raise TransportError(
                    f"cannot upload to {dest}: directory {parent} does not exist on the device",
                    "create it first (Transport.mkdir)",
                ) from None
            if not stat.S_ISDIR(pst.st_mode or 0):
                raise TransportError(f"cannot upload to {dest}: {parent} is not a directory", "check the remote path") from None
            return
        if stat.S_ISDIR(st.st_mode or 0):
            raise TransportError(f"cannot upload to {dest}: it is a directory", "give the file's full remote path")

    def _start_follower(self, tmp: str, size: int):
        """Start the device-side hasher that follows ``tmp`` as it grows (a channel, or None)."""
        import paramiko

        try:
            chan = self.ssh._transport.open_session(timeout=self.ssh.connect_timeout)
            chan.exec_command(shlex.join(["sh", "-c", FOLLOWER, "sh", self.ssh.python, tmp, str(size), f"{self.ssh.idle_timeout:g}"]))
            chan.shutdown_write()
            return chan
        except (paramiko.SSHException, EOFError, OSError, AttributeError):
            return None  # the upload itself will fail or succeed on its own; hash afterwards

    def _finish_follower(self, chan) -> str | None:
        """The follower's digest (None when it could not tell: no Python, stalled, too slow)."""
        out = bytearray()
        try:
            chan.settimeout(max(self.ssh.idle_timeout, 10.0))
            while data := chan.recv(4096):
                out += data
            text = out.decode("ascii", errors="replace").strip()
            return text if chan.recv_exit_status() == 0 and len(text) == 64 else None
        except Exception:
            return None
        finally:
            with contextlib.suppress(Exception):
                chan.close()

    def _send(self, sftp, local: Path, tmp: str, offset: int, size: int, progress, opened: Callable[[], None] | None = None) -> tuple[int, str | None]:
        """Write ``local[offset:]`` to ``tmp`` at ``offset``: bytes sent, and the sha256 of what the
        device stored when the file is small enough to read back (else None). ``opened()`` runs
        once the file is open."""
        sent = 0
        stored = None
        readback = size <= READBACK_MAX
        with self._sftp_op(f"uploading {local.name}"), self.ssh._activity():
            try:
                fh = sftp.open(tmp, "r+" if offset else "w+" if readback else "w")
            except PermissionError:
                raise TransportError(f"cannot write {tmp} on the device: permission denied", "check the directory's owner and mode") from None
            except OSError as exc:
                self._diagnose_write_failure(tmp, posixpath.dirname(tmp), size - offset)
                raise TransportError(f"cannot write {tmp} on the device: {exc.strerror or exc}", "check free space and permissions") from None
            try:
                if opened is not None:
                    opened()
                with open(local, "rb") as src:
                    src.seek(offset)
                    if _pipelines(sftp):
                        sent = self._write_all(sftp, fh.handle, src, offset, progress)
                    else:  # a paramiko whose internals we don't know: its own (slower) pipelined writes
                        sent = self._write_plain(fh, src, offset, progress)
                if offset + sent != size:
                    raise TransportError(f"{local} changed while it was being uploaded", "upload it again")
                self._fsync_remote(sftp, fh)
                if readback and _pipelines(sftp):
                    stored = self._read_back(sftp, fh.handle, size)
                fh.close()  # waits for the server's answer, which follows every write: the data is there
            except OSError as exc:
                if self._is_link_failure(exc):
                    raise
                self._diagnose_write_failure(tmp, posixpath.dirname(tmp), size - offset)
                raise TransportError(f"writing {tmp} on the device failed: {exc.strerror or exc}", "check free space on the device") from None
            finally:
                with contextlib.suppress(Exception):
                    fh.close()
            if self.ssh._transport is None or not self.ssh._transport.is_active() or self.ssh._stalled:
                raise EOFError("the connection closed during the upload")
        return sent, stored

    def _read_back(self, sftp, handle: bytes, size: int) -> str | None:
        """sha256 of what the device has under ``handle``, read back in one round trip: pipelined
        32 KiB reads (every server answers those in full) and one past the end, which must find
        nothing. None when the file is not exactly ``size`` bytes long."""
        from paramiko.sftp import CMD_DATA, CMD_READ
        from paramiko.sftp_client import int64

        def request(pos: int, n: int) -> int:
            return sftp._async_request(type(None), CMD_READ, handle, int64(pos), n)

        def answer(num: int) -> bytes:
            try:
                t, msg = sftp._read_response(num)
            except EOFError:  # the SFTP status "end of file" (a dropped link raises SSHException)
                return b""
            return msg.get_string() if t == CMD_DATA else b""

        asked = [(min(MIN_WRITE, size - pos), request(pos, min(MIN_WRITE, size - pos))) for pos in range(0, size, MIN_WRITE)]
        past_end = request(size, 1)
        h, whole = hashlib.sha256(), True
        for n, num in asked:
            data = answer(num)
            whole = whole and len(data) == n
            h.update(data)
        longer = answer(past_end) != b""
        return h.hexdigest() if whole and not longer else None

    def _write_plain(self, fh, src, offset: int, progress) -> int:
        fh.set_pipelined(True)
        fh.seek(offset)
        sent = 0
        while block := src.read(MIN_WRITE * 8):
            fh.write(block)
            sent += len(block)
            self.ssh.beat()
            progress(len(block), offset + sent)
        return sent

    def _write_all(self, sftp, handle: bytes, src, offset: int, progress) -> int:
        """Send ``src`` from its position to ``handle`` at ``offset`` as pipelined writes; bytes sent.
        Every write is answered (in order): an error status raises OSError here."""
        from paramiko.sftp import CMD_STATUS, CMD_WRITE

        chunk = self._write_size(sftp, len(handle))
        # One buffer for every request: header, then the data read straight into it. paramiko's
        # own path copies each request again per packet it is cut into (``out = out[n:]``).
        head = WRITE_HEAD + len(handle)
        buf = bytearray(head + chunk)
        view = memoryview(buf)
        struct.pack_into(f">I{len(handle)}s", buf, 9, len(handle), handle)
        chan = sftp.sock
        pending: deque[int] = deque()
        sent = 0
        try:
            while n := src.readinto(view[head:]):
                with sftp._lock:  # the request ids and the table of awaited answers are paramiko's
                    num = sftp.request_number
                    sftp._expecting[num] = type(None)  # what SFTPClient._request files a plain request under
                    sftp.request_number += 1
                struct.pack_into(">IBI", buf, 0, head - 4 + n, CMD_WRITE, num)
                struct.pack_into(">QI", buf, head - 12, offset + sent, n)
                pending.append(num)
                out = view[: head + n]
                while out:
                    k = chan.send(out)  # one channel packet's worth at a time
                    if k <= 0:
                        raise EOFError("the SFTP channel closed during the upload")
                    out = out[k:]
                sent += n
                while len(pending) * chunk > IN_FLIGHT:
                    self._expect_status(sftp, pending.popleft(), CMD_STATUS)
                self.ssh.beat()
                progress(n, offset + sent)
            while pending:
                self._expect_status(sftp, pending.popleft(), CMD_STATUS)
        finally:
            with sftp._lock:  # answers not read (an error stopped us) are dropped when they come
                for num in pending:
                    sftp._expecting.pop(num, None)
        return sent

    @staticmethod
    def _expect_status(sftp, num: int, status: int) -> None:
        t, _msg = sftp._read_response(num)  # raises OSError on an error status
        if t != status:
            raise OSError(f"unexpected SFTP answer {t} to a write")

    def _write_size(self, sftp, handle_len: int) -> int:
        """Bytes of data per write request: as many as the server takes, rounded down so that the
        request fills whole SSH channel packets (paramiko's cost is per packet, not per byte)."""
        if self._max_write is None:
            self._max_write = self._server_max_write(sftp)
        packet = sftp.get_channel().out_max_packet_size - 64  # what Channel.send puts in one packet
        header = WRITE_HEAD + handle_len
        if packet <= header:
            return MIN_WRITE
        packets = max(1, (self._max_write + header) // packet)
        return min(packets * packet - header, self._max_write)

    def _server_max_write(self, sftp) -> int:
        """The largest write the SFTP server takes: its limits@openssh.com answer, else ``MIN_WRITE``."""
        from paramiko.sftp import CMD_EXTENDED, CMD_EXTENDED_REPLY, SFTPError

        try:
            t, msg = sftp._request(CMD_EXTENDED, "limits@openssh.com")
        except (OSError, SFTPError) as exc:  # an error status: the server lacks the extension
            if self._is_link_failure(exc):
                raise
            return MIN_WRITE
        if t != CMD_EXTENDED_REPLY:
            return MIN_WRITE
        _packet, _read, write = msg.get_int64(), msg.get_int64(), msg.get_int64()
        return min(write, 1 << 20) if write >= MIN_WRITE else MIN_WRITE  # 0 means "no limit": stay safe

    def _fsync_remote(self, sftp, fh) -> None:
        """Flush, then fsync@openssh.com on the open handle when the server has it (OpenSSH does)."""
        from paramiko.sftp import CMD_EXTENDED

        fh.flush()
        try:
            sftp._request(CMD_EXTENDED, "fsync@openssh.com", fh.handle)
        except Exception as exc:
            if self._is_link_failure(exc):
                raise

    def _diagnose_write_failure(self, tmp: str, directory: str, needed: int) -> None:
        """A write failed or arrived short: raise DeviceError if the device's disk is full."""
        free = None  # bytes free for this user there (None: unknown)
        with contextlib.suppress(TransportError):
            res = self.ssh._exec(["sh", "-c", DF, "sh", self.ssh._abs(directory)], timeout=min(60.0, self.ssh.idle_timeout))
            text = res.stdout.decode().strip()
            if res.returncode == 0 and text.isdigit():
                free = int(text)
        if free is not None and free < max(needed, 1) + 64 * 1024:
            self._remove_quietly(tmp)
            raise DeviceError(
                f"the device's disk is full: {free // 1024} KiB free in {directory}, the upload needs {max(needed, 0) // 1024 + 1} KiB",
                f"free space on {self.ssh.target.hostname} (old bundles live under {self.ssh.root}/bundles and {self.ssh.root}/objects)",
            )

    def _remove_quietly(self, path: str) -> None:
        if self._sftp is None:
            return
        with contextlib.suppress(Exception):
            self._sftp.remove(path)

    def get(self, remote: str, local: Path) -> None:
        src = self.ssh._abs(remote)
        sftp = self._sftp_client()
        with self._sftp_op(f"downloading {src}"):
            try:
                sftp.stat(src)
            except FileNotFoundError:
                raise TransportError(f"cannot download {src}: no such file on the device", "check the remote path") from None
            with atomic_path(Path(local)) as tmp:
                try:
                    sftp.get(src, str(tmp))
                except OSError as exc:
                    if self._is_link_failure(exc):
                        raise
                    raise TransportError(f"cannot download {src}: {exc.strerror or exc}", "check the remote path and permissions") from None

    def sha256(self, remote: str) -> str | None:
        return self._hash(self.ssh._abs(remote))

    def _hash(self, path: str, size: int | None = None) -> str | None:
        prefer = "py" if size is not None and size >= PY_HASH_MIN else "sum"
        res = self.ssh._exec(["sh", "-c", HASHER, "sh", path, self.ssh.python, prefer], timeout=max(600.0, self.ssh.idle_timeout))
        text = res.stdout.decode("utf-8", errors="replace").strip()
        if res.returncode == 0 and text == "missing":
            return None
        if res.returncode == 3 and text == "notfile":
            raise TransportError(f"{path} on the device is not a file", "check the remote path")
        word = text.split()[0] if text else ""
        if res.returncode != 0 or len(word) != 64:
            tail = res.stderr_tail(2)
            raise TransportError(
                f"cannot hash {path} on the device (exit code {res.returncode}){': ' + tail if tail else ''}",
                f"the device needs sha256sum (coreutils) or Python ({self.ssh.python})",
            )
        return word.lower()

    def mkdir(self, remote: str) -> None:
        path = self.ssh._abs(remote)
        sftp = self._sftp_client()
        with self._sftp_op(f"creating {path}"):
            missing = []
            for probe in [path, *map(str, PurePosixPath(path).parents)]:
                try:
                    st = sftp.stat(probe)
                except FileNotFoundError:
                    missing.append(probe)
                    continue
                except OSError as exc:
                    raise TransportError(f"cannot create directory {path}: {exc.strerror or exc}", "check permissions") from None
                if not stat.S_ISDIR(st.st_mode or 0):
                    raise TransportError(f"cannot create directory {path}: a file is in the way ({probe})", "remove that file")
                break
            for d in reversed(missing):
                try:
                    sftp.mkdir(d, 0o755)
                except OSError as exc:
                    with contextlib.suppress(OSError):
                        if stat.S_ISDIR(sftp.stat(d).st_mode or 0):
                            continue  # made meanwhile by someone else
                    raise TransportError(f"cannot create directory {d}: {exc.strerror or exc}", "check permissions") from None

