"""Host and user names as strictly as OpenSSH reads them (``valid_hostname``/``valid_ruser``, ssh.c).

A host or user name ends up in ``%h``/``%r``/``%n`` of a ProxyCommand, which runs through a
shell: ``lab-1;touch${IFS}x;`` in an inventory would run ``touch``. OpenSSH (since 9.6)
refuses such names, and so does edgekit, for every source (``--device``, inventories,
~/.ssh/config), before anything is looked up or connected. The rules are OpenSSH's, on the
UTF-8 bytes in the C locale: bytes >= 0x80 pass, as they do for ssh.
"""

from __future__ import annotations

import re

from edgekit.errors import EdgekitError, InputError

# C isspace() and iscntrl() in the C locale are the bytes 0x00-0x20 and 0x7f (NUL too: ssh would
# cut the name there); a user may hold a space, but not one before '-' (it would read as an option).
_HOST_BAD = re.compile(rb"[\x00-\x20\x7f'`\"$\\;&<>|(){},]")
_USER_BAD = re.compile(rb"[\x00-\x1f\x7f'`\";&<>|(){}]| -|\\\Z")


def _ok(text: str, bad: re.Pattern[bytes]) -> bool:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no byte string ssh could be given
        return False
    return bool(raw) and raw[:1] != b"-" and not bad.search(raw)


def host_ok(host: str) -> bool:
    """True when OpenSSH would accept ``host`` as a host name."""
    return _ok(host, _HOST_BAD)


def user_ok(user: str) -> bool:
    """True when OpenSSH would accept ``user`` as a remote user name (and it is not empty)."""
    return _ok(user, _USER_BAD)


def _check(value: str, where: str, error: type[EdgekitError], kind: str, ok, rule: str) -> str:
    if not ok(value):
        text = repr(value) if len(value) <= 60 else repr(value[:56]) + "..."
        raise error(
            f"{where}: {kind} name {text} has characters OpenSSH refuses (it could reach a shell through ProxyCommand)",
            f"a {kind} name must {rule}",
        )
    return value


def check_host(host: str, where: str, error: type[EdgekitError] = InputError) -> str:
    """``host`` when OpenSSH would accept it; else ``error`` naming ``where`` and the value."""
    return _check(host, where, error, "host", host_ok, "not start with '-' nor hold spaces, control characters or any of ' ` \" $ \\ ; & < > | ( ) { } ,")


def check_user(user: str, where: str, error: type[EdgekitError] = InputError) -> str:
    """``user`` when OpenSSH would accept it; else ``error`` naming ``where`` and the value."""
    return _check(user, where, error, "user", user_ok, "not be empty, start with '-', end with '\\', nor hold ' -', control characters or any of ' ` \" ; & < > | ( ) { }")
