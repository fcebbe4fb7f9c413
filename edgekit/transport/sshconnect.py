"""Opening an SSH connection: TCP (or ProxyJump / ProxyCommand), handshake, host key check,
authentication. Failures: ``LinkError`` when retrying may help, else ``TransportError``."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import shlex
import signal
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgekit.errors import LinkError, TransportError
from edgekit.transport.sshconfig import (
    SshTarget,
    add_known_host,
    host_key_status,
    known_keys,
    resolve_target,
)

WINDOW_SIZE = 8 * 1024 * 1024


@dataclass(frozen=True)
class SshConnector:
    """What opening a connection needs: the ssh config, timeouts, trust and credentials."""

    config: Any
    connect_timeout: float
    trust_new_host: bool
    password: str | None
    log: Callable[[str], None]

    def open(self, target: SshTarget, hops: list, sock: Any = None):
        """An authenticated paramiko Transport to ``target`` (over ``sock`` when given)."""
        import paramiko

        if sock is None and target.proxy_jump:
            sock = self._through_jumps(target, hops)
        elif sock is None and target.proxy_command:
            try:
                sock = paramiko.ProxyCommand(target.proxy_command)
            except Exception as exc:
                raise TransportError(f"ProxyCommand for {target.alias} failed to start: {exc}", "check ProxyCommand in ~/.ssh/config") from None
        elif sock is None:
            sock = self._tcp(target)
        t = paramiko.Transport(sock, default_window_size=WINDOW_SIZE)
        t.banner_timeout = t.handshake_timeout = t.auth_timeout = self.connect_timeout
        _prefer_fast_ciphers(t)
        _catch_exit_signals(t)
        opts = t.get_security_options()
        # ssh's HostKeyAlgorithms, in its order, as far as paramiko has them
        order = [a for a in target.host_key_algorithms if a in opts.key_types] or list(opts.key_types)
        known = {k.keytype for k in known_keys(target)}
        if known:  # as OpenSSH's order_hostkeyalgs: algorithms of keys known for the host first, in that order
            order = [a for a in order if _key_type(a) in known] + [a for a in order if _key_type(a) not in known]
        opts.key_types = tuple(order)
        try:
            try:
                t.start_client(timeout=self.connect_timeout)
            except paramiko.SSHException as exc:
                if "banner" in str(exc).lower():
                    raise TransportError(
                        f"{target.hostname}:{target.port} did not answer as an SSH server ({exc})",
                        "check the port (Port in ~/.ssh/config, or user@host:PORT) and that sshd runs there",
                    ) from None
                raise LinkError(
                    f"the SSH handshake with {target.display} failed: {exc}",
                    "check the network to the device; edgekit retries pushes on their own",
                ) from None
            except (EOFError, OSError) as exc:
                raise LinkError(f"the connection to {target.display} dropped during the handshake: {exc}", "retry; check the network") from None
            try:
                server_key = t.get_remote_server_key()
            except paramiko.SSHException:  # start_client gave up waiting: no handshake in time
                if not getattr(t, "remote_version", ""):
                    raise TransportError(
                        f"{target.hostname}:{target.port} did not answer as an SSH server (no SSH banner within {self.connect_timeout:g}s)",
                        "check the port (Port in ~/.ssh/config, or user@host:PORT) and that sshd runs there",
                    ) from None
                raise LinkError(
                    f"the SSH handshake with {target.display} did not finish within {self.connect_timeout:g}s",
                    "the device or the network is very slow; raise ConnectTimeout in ~/.ssh/config",
                ) from None
            self._check_host_key(target, server_key)
            self._authenticate(target, t)
            t.set_keepalive(30)
        except BaseException:
            t.close()
            raise
        return t

    def _tcp(self, target: SshTarget) -> socket.socket:
        where = f"{target.hostname}:{target.port}"
        try:
            sock = socket.create_connection((target.hostname, target.port), timeout=self.connect_timeout)
        except socket.gaierror as exc:
            raise TransportError(
                f"cannot resolve host name '{target.hostname}' ({exc.strerror})",
                f"check the spelling, DNS, or add a Host {target.alias} block with HostName to ~/.ssh/config",
            ) from None
        except ConnectionRefusedError:
            raise LinkError(f"connection refused by {where}", "is sshd running on the device, and is the port right?") from None
        except TimeoutError:
            raise LinkError(
                f"timed out connecting to {where} after {self.connect_timeout:g}s",
                "the device is off, unreachable, or a firewall drops SSH; check the address and the network",
            ) from None
        except OSError as exc:
            if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN):
                raise LinkError(f"cannot reach {where}: {exc.strerror}", "check the address, the cable and the route to the device") from None
            raise LinkError(f"cannot connect to {where}: {exc.strerror or exc}", "check the address and the network") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _through_jumps(self, target: SshTarget, hops: list):
        """A direct-tcpip channel to ``target`` through its ProxyJump chain (hops appended to ``hops``)."""
        import paramiko

        chain = [resolve_target(spec, self.config, _hop=True) for spec in target.proxy_jump]
        via = None
        for hop in [*chain, target]:
            if via is None:
                t = self.open(hop, hops)
            else:
                try:
                    chan = via.open_channel("direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=self.connect_timeout)
                except paramiko.ChannelException as exc:
                    raise LinkError(
                        f"the jump host could not open a connection to {hop.hostname}:{hop.port}: {exc.text or exc}",
                        "check HostName/Port as the jump host sees them, and AllowTcpForwarding on the jump host",
                    ) from None
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    raise LinkError(f"the jump host connection failed: {exc}", "retry; check the jump host") from None
                if hop is target:
                    return chan
                t = self.open(hop, hops, sock=chan)
            hops.append(t)
            via = t
        raise AssertionError("unreachable")

    # -- host keys --------------------------------------------------------------------------
    def _check_host_key(self, target: SshTarget, key) -> None:
        keytype, key_b64 = key.get_name(), key.get_base64()
        verdict, k = host_key_status(target, keytype, key_b64)
        if verdict == "ok":
            return
        fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
        name = target.known_hosts_name
        if verdict == "revoked":
            raise TransportError(
                f"the host key of {name} ({keytype} {fingerprint}) is REVOKED by {k.path} line {k.lineno}; refusing to connect",
                "a revoked key is never accepted (not even with --trust-new-host): give the device a new host key, "
                "or remove the @revoked line if it is wrong",
            )
        if verdict == "changed":
            raise TransportError(
                f"the host key of {name} has CHANGED: it now offers {keytype} {fingerprint}, "
                f"but {k.path} line {k.lineno} holds a different key; refusing to connect",
                f"if the device was reinstalled, remove the old key (ssh-keygen -f {shlex.quote(k.path)} -R {shlex.quote(name)}) "
                "and connect again with --trust-new-host; otherwise someone may be intercepting the connection",
            )
        trust = self.trust_new_host or target.strict_host_key_checking == "accept-new"
        revoked_bare = f"; its key is revoked for {target.hostname} by {k.path} line {k.lineno}" if k is not None and k.marker == "revoked" else ""
        if revoked_bare and trust:
            self.log(f"warning: the host key of {name} is revoked for {target.hostname} by {k.path} line {k.lineno}; trusted as a new host for {name}, as ssh does")
        if not trust:
            raise TransportError(
                f"{name} is not a known host (its {keytype} key is {fingerprint}){revoked_bare}",
                "check the fingerprint on the device (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                "then pass --trust-new-host once to save it to ~/.ssh/known_hosts",
            )
        try:
            path = add_known_host(target, keytype, key_b64)
        except TransportError as exc:  # ssh too goes on when it cannot save the key ("Failed to add the host")
            self.log(f"warning: trusted new host {name} ({keytype} {fingerprint}) for this connection only: {exc.message}")
            return
        self.log(f"trusted new host {name} ({keytype} {fingerprint}); saved to {path}")

    # -- authentication ----------------------------------------------------------------------
    def _authenticate(self, target: SshTarget, t) -> None:
        import paramiko

        tried: list[str] = []
        notes: list[str] = []
        allowed: list[str] | None = None

        def attempt(label: str, key) -> bool:
            nonlocal allowed
            try:
                rest = t.auth_publickey(target.user, key)
            except paramiko.BadAuthenticationType as exc:
                allowed = list(exc.allowed_types)
                return False
            except paramiko.AuthenticationException:
                tried.append(label)
                return False
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise LinkError(f"the connection to {target.display} dropped during authentication: {exc}", "retry") from None
            if rest:
                notes.append(f"the server wants more after the key ({', '.join(rest)})")
                return False
            return True

        agent = None
        try:
            if os.environ.get("SSH_AUTH_SOCK"):
                try:
                    agent = paramiko.Agent()
                    agent_keys = list(agent.get_keys())
                except Exception:  # an unreachable agent is no reason to fail: keys may be on disk
                    agent_keys = []
                wanted = _fingerprints(target.identity_files) if target.identities_only else None
                for key in agent_keys:
                    if wanted is not None and key.get_fingerprint() not in wanted:
                        continue
                    if attempt(f"agent key {key.get_name()}", key):
                        return
                    if allowed is not None and "publickey" not in allowed:
                        break
            for path in target.identity_files:
                if allowed is not None and "publickey" not in allowed:
                    break
                if not os.path.exists(path):
                    notes.append(f"IdentityFile {path} does not exist")
                    continue
                try:
                    key = paramiko.PKey.from_path(path)
                except paramiko.PasswordRequiredException:
                    notes.append(f"{path} is passphrase-protected (add it to ssh-agent: ssh-add {shlex.quote(path)})")
                    continue
                except Exception as exc:
                    notes.append(f"cannot read key {path}: {exc}")
                    continue
                if attempt(path, key):
                    return
            if self.password is not None:
                try:
                    t.auth_password(target.user, self.password)
                    return
                except paramiko.BadAuthenticationType as exc:
                    if "keyboard-interactive" in exc.allowed_types:
                        with contextlib.suppress(paramiko.AuthenticationException):
                            t.auth_interactive(target.user, lambda title, instr, prompts: [self.password] * len(prompts))
                            return
                    tried.append("password (not allowed by the server)")
                except paramiko.AuthenticationException:
                    tried.append("password")
        finally:
            if agent is not None:
                agent.close()
        what = ", ".join(tried) if tried else "no keys (none in ssh-agent, no identity files)"
        extra = f"; {'; '.join(notes)}" if notes else ""
        if allowed is not None:
            extra += f"; the server allows: {', '.join(allowed)}"
        raise TransportError(
            f"authentication failed for {target.user}@{target.hostname}:{target.port} (tried {what}){extra}",
            f"install your public key on the device (ssh-copy-id -p {target.port} {target.user}@{target.hostname}) "
            "or set IdentityFile for it in ~/.ssh/config; password login needs --password",
        )


def _key_type(algorithm: str) -> str:
    """The key type behind a host key algorithm (rsa-sha2-512 signs with an ssh-rsa key)."""
    return "ssh-rsa" if algorithm.startswith("rsa-sha2-") else algorithm


def _prefer_fast_ciphers(t) -> None:
    """AES-GCM first, then AES-CTR with encrypt-then-MAC, then paramiko's defaults.

    paramiko's cost is per byte in the cipher and per packet in Python: AES-GCM (one AEAD call
    per packet, no separate MAC pass) took 0.49 s of host CPU for a 200 MB upload where
    aes128-ctr + hmac-sha2-256 took 0.72 s (loopback sshd, 2026-11-24). paramiko has no
    chacha20-poly1305, OpenSSH's own first choice. For CTR, encrypt-then-MAC is the sound
    construction (paramiko lists the older MAC-then-encrypt ones first)."""
    opts = t.get_security_options()
    fast = [c for c in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr") if c in opts.ciphers]
    opts.ciphers = tuple(dict.fromkeys([*fast, *opts.ciphers]))
    etm = [m for m in ("hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com") if m in opts.digests]
    opts.digests = tuple(dict.fromkeys([*etm, *opts.digests]))


def _catch_exit_signals(t) -> None:
    """Record "exit-signal" requests (paramiko ignores them) so a killed command reports -SIGNUM."""
    from paramiko.channel import Channel
    from paramiko.common import MSG_CHANNEL_REQUEST

    table = getattr(t, "_channel_handler_table", None)
    if not isinstance(table, dict) or MSG_CHANNEL_REQUEST not in table:
        return
    original = table[MSG_CHANNEL_REQUEST]

    def handle(chan: Channel, m) -> None:
        pos = m.packet.tell()
        try:
            if m.get_text() == "exit-signal":
                m.get_boolean()  # want_reply
                name = m.get_text()
                chan._edgekit_signal = getattr(signal, f"SIG{name}", None) or getattr(signal, name, 0) or 0
                chan.exit_status = -int(chan._edgekit_signal)
                chan.status_event.set()
                return
        except Exception:
            pass
        m.packet.seek(pos)
        original(chan, m)

    t._channel_handler_table = {**table, MSG_CHANNEL_REQUEST: handle}


def _fingerprints(paths: Sequence[str]) -> set[bytes]:
    import paramiko

    out = set()
    for path in paths:
        with contextlib.suppress(Exception):
            blob = base64.b64decode(open(path + ".pub").read().split()[1])
            out.add(hashlib.md5(blob).digest())
        with contextlib.suppress(Exception):
            out.add(paramiko.PKey.from_path(path).get_fingerprint())
    return out
