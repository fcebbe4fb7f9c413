"""Host and user names as strictly as OpenSSH reads them (``valid_hostname``/``valid_ruser``, ssh.c).

A host or user name ends up in ``%h``/``%r``/``%n`` of a ProxyCommand, which runs through a
shell: ``lab-1;touch${IFS}x;`` in an inventory would run ``touch``. OpenSSH (since 9.6)
refuses such names, and so does edgekit, for every source (``--device``, inventories,
~/.ssh/config), before anything is looked up or connected. The rules are OpenSSH's, on the
UTF-8 bytes in the C locale: bytes >= 0x80 pass, as they do for ssh.
"""

from __future__ import annotations

from edgekit.errors import EdgekitError, InputError

_HOST_BAD = frozenset(b"'`\"$\\;&<>|(){},")
_USER_BAD = frozenset(b"'`\";&<>|(){}")
_SPACE = frozenset(b" \t\n\v\f\r")


def _cntrl(byte: int) -> bool:
    return byte < 0x20 or byte == 0x7F  # NUL included: ssh would cut the name there


def _utf8(text: str) -> bytes | None:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no byte string ssh could be given
        return None


def host_ok(host: str) -> bool:
    """True when OpenSSH would accept ``host`` as a host name."""
    raw = _utf8(host)
    if not raw or raw[0] == ord("-"):
        return False
    return not any(b in _HOST_BAD or b in _SPACE or _cntrl(b) for b in raw)


def user_ok(user: str) -> bool:
    """True when OpenSSH would accept ``user`` as a remote user name (and it is not empty)."""
    raw = _utf8(user)
    if not raw or raw[0] == ord("-") or raw[-1] == ord("\\"):
        return False
    for i, b in enumerate(raw):
        if _cntrl(b) or b in _USER_BAD:
            return False
        if b in _SPACE and raw[i + 1 : i + 2] == b"-":  # "x -oProxyCommand=..." would read as an option
            return False
    return True


def shown(value: str, limit: int = 60) -> str:
    """``value`` for an error message: quoted, escapes visible, cut when very long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def check_host(host: str, where: str, error: type[EdgekitError] = InputError) -> str:
    if not host_ok(host):
        raise error(
            f"{where}: host name {shown(host)} has characters OpenSSH refuses (it could reach a shell through ProxyCommand)",
            "a host name must not start with '-' nor contain spaces, control characters or any of ' ` \" $ \\ ; & < > | ( ) { } ,",
        )
    return host


def check_user(user: str, where: str, error: type[EdgekitError] = InputError) -> str:
    if not user_ok(user):
        raise error(
            f"{where}: user name {shown(user)} has characters OpenSSH refuses (it could reach a shell through ProxyCommand)",
            "a user name must not be empty, start with '-', end with '\\', nor contain control characters or any of ' ` \" ; & < > | ( ) { }",
        )
    return user
