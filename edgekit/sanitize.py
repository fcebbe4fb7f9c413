"""Device text is data: what a device says (an error, a runtime's message, a host name) is made
safe before it reaches JUnit, markdown, HTML or a terminal.

* ``plain``: ANSI escape sequences (CSI, OSC, other ESC forms) and every other control character
  removed, runs of whitespace (newlines included) folded to one space: one line, nothing a
  terminal, an XML parser or a CI log parser acts on. XML 1.0 cannot even carry most control
  characters, so an unstripped colour code makes a JUnit file unparsable.
* ``markdown``: ``plain``, then every character markdown or inline HTML gives a meaning to
  backslash-escaped (``<`` and ``&`` as entities), so a device's text renders as the text it is:
  no links, images, emphasis, table cells or ``</details>``.
* ``quoted``: ``plain`` behind a fixed prefix, for a line of output that carries device text: a
  line never starts with it, so a device cannot print a fake ``error:``/``hint:`` line or a GitHub
  Actions workflow command (``::error``).
"""

from __future__ import annotations

import re

# ESC [ ... final byte (CSI), ESC ] ... BEL or ESC \ (OSC), ESC P/X/^/_ ... ESC \ (DCS, SOS, PM, APC),
# then any other two-byte ESC sequence; C1 CSI (0x9b) too.
_ANSI = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"
    r"|\x1b[@-Z\\-_]?"
)
# C0 and C1 controls, DEL, and the Unicode line/paragraph separators and bidi overrides
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")
# what makes markdown (GFM: tables, autolinks, strikethrough) or inline HTML act: escaped everywhere,
# since a device's text is never at the start of a line (quoted), only these act mid-line
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()!|~>:.])")
MAX_CHARS = 2000  # a device's message longer than this is cut (it is one line in a report)


def plain(text: object, limit: int = MAX_CHARS) -> str:
    """``text`` without escape sequences or control characters, on one line, at most ``limit`` characters."""
    s = _ANSI.sub("", str(text))
    s = _CONTROL.sub(" ", s)
    s = " ".join(s.split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def markdown(text: object, limit: int = MAX_CHARS) -> str:
    """``plain`` text with markdown's and HTML's special characters escaped (safe in a table cell)."""
    s = plain(text, limit).replace("&", "&amp;").replace("<", "&lt;")
    return _MD_SPECIAL.sub(r"\\\1", s)


def quoted(prefix: str, text: object, limit: int = MAX_CHARS) -> str:
    """One output line ``prefix`` + ``plain(text)``; ``prefix`` must be edgekit's own words."""
    if not prefix.strip():
        raise ValueError("a line with device text starts with edgekit's own words")
    return f"{prefix}{plain(text, limit)}"
