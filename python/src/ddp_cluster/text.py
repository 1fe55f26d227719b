"""Text a job wrote, as the controller shows it and reads it: shown, never obeyed; read in bounded memory.

A job's bytes reach the controller's terminal (``jobs.yml -e logs``, the report's log tail, the doctor's
evidence, a status's reason and progress) and its files are read there (metrics.jsonl, telemetry). Both are
the job's to choose, so:

- :func:`visible` makes every character a terminal would obey visible, as Python's ``repr`` writes it
  (``\\x1b``, ``\\r``, ``\\x9b``, ``\\u202e``): C0 controls but tab and newline (ESC, and with it every escape
  sequence: a title set, a screen clear, an OSC 52 clipboard write; BEL, backspace; a carriage return that
  would write over a line's ``[NODE rank R]`` prefix), DEL, C1 controls (U+0080 to U+009F: an 8-bit CSI is
  one), the Unicode bidirectional controls (text shown in another order than it is: "Trojan source"), the
  line and paragraph separators, and lone surrogates (bytes that were no UTF-8, decoded with
  ``surrogateescape``). Everything else, other scripts and emoji included, is shown as it is. A backslash
  is not doubled (a log's Windows paths stay readable), so a log's own text ``\\x1b`` looks like an ESC it
  printed: either way nothing was obeyed. The result holds nothing it would change: ``visible`` applied
  twice is ``visible`` once.
- :func:`lines` reads a file line by line with a bound on one line and on the whole, so a multi-gigabyte
  file, or one line of that size, costs the reader a line's worth of memory.

Standard library only, importing nothing of the package: every part (the node's Python too) may use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

# What a terminal obeys or a reader misreads (see the module's text); tab and newline are kept.
_OBEYED = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_HIDDEN = re.compile(f"[{_OBEYED}]")
_HIDDEN_OR_NEWLINE = re.compile(f"[\n{_OBEYED}]")
_NAMED = {"\r": "\\r", "\n": "\\n"}


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, newlines: bool = True) -> str:
    """``text`` with every character a terminal would obey written out (see the module's text); with
    ``newlines=False`` a newline too (one line of a table or a prefixed log stays one line)."""
    return (_HIDDEN if newlines else _HIDDEN_OR_NEWLINE).sub(_shown, text)


@dataclass(frozen=True)
class Line:
    """One line of a file read by :func:`lines`: its number (from 1), its bytes without the newline (at most
    the bound: ``cut`` says it was longer), and whether it ended with a newline (the file's last may not:
    a torn line)."""

    number: int
    data: bytes
    cut: bool = False
    ended: bool = True


def lines(handle: IO[bytes], max_line: int, max_bytes: int | None = None) -> Iterator[Line]:
    """The lines of a binary file, each at most ``max_line`` bytes (the rest of a longer one is skipped,
    never held); reading stops after ``max_bytes`` (None: the whole file): a line cut there is not
    ``ended``."""
    number, read = 0, 0
    while max_bytes is None or read < max_bytes:
        want = max_line + 1 if max_bytes is None else min(max_line + 1, max_bytes - read)
        data = handle.readline(want)
        if not data:
            return
        read += len(data)
        number += 1
        if data.endswith(b"\n"):
            yield Line(number, data[:-1])
            continue
        if len(data) < want:  # the file's end: a last line without its newline
            yield Line(number, data, ended=False)
            return
        if len(data) <= max_line:  # cut by max_bytes: the rest is never read
            yield Line(number, data, ended=False)
            return
        # Longer than max_line: its first max_line bytes, then the rest skipped (read in pieces).
        ended = False
        while max_bytes is None or read < max_bytes:
            rest = handle.readline(64 * 1024 if max_bytes is None else min(64 * 1024, max_bytes - read))
            read += len(rest)
            if not rest or rest.endswith(b"\n"):
                ended = rest.endswith(b"\n")
                break
        yield Line(number, data[:max_line], cut=True, ended=ended)
        if not ended:
            return


# A Sphinx cross-reference in a docstring: :func:`name`, :mod:`~a.b`, :class:`text <target>`.
_ROLE = re.compile(r":[a-z]+:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")


def plain(doc: str | None) -> str:
    """A docstring as ``--help`` shows it: Sphinx's cross-references written as their names (``~a.b.c`` as
    ``c``) and its literal quotes (two backquotes) taken out."""

    def named(match: re.Match[str]) -> str:
        name = match.group(2)
        return name.rsplit(".", 1)[-1] if match.group(1) else name

    return _ROLE.sub(named, doc or "").replace("``", "")
