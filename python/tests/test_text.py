"""Text a job wrote: shown, never obeyed (ddp_cluster.text.visible), and read in bounded memory
(ddp_cluster.text.lines)."""

from __future__ import annotations

import io

import pytest

from ddp_cluster.text import Line, lines, plain, visible


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b]0;my title\x07", "\\x1b]0;my title\\x07"),  # OSC 0: the window's title
        ("\x1b]52;c;cm0gLXJmIH4=\x07", "\\x1b]52;c;cm0gLXJmIH4=\\x07"),  # OSC 52: a clipboard write
        ("\x1b]52;c;eA==\x1b\\", "\\x1b]52;c;eA==\\x1b\\"),  # the same, ended by ST
        ("\x1b[2J\x1b[3J\x1bc", "\\x1b[2J\\x1b[3J\\x1bc"),  # screen and scrollback clears, a reset
        ("\x07", "\\x07"),  # BEL
        ("abc\x08\x08x", "abc\\x08\\x08x"),  # backspaces over what was shown
        ("[n0 rank 0] ok\rforged", "[n0 rank 0] ok\\rforged"),  # a carriage return over the prefix
        ("\x9b31m\x9d0;t\x9c", "\\x9b31m\\x9d0;t\\x9c"),  # C1: 8-bit CSI, OSC, ST
        ("\x7f\x00\x0b\x0c", "\\x7f\\x00\\x0b\\x0c"),  # DEL, NUL, vertical tab, form feed
        ("if x\u202e } \u2066{\u2069", "if x\\u202e } \\u2066{\\u2069"),  # bidi overrides and isolates
        ("\u200f\u061c", "\\u200f\\u061c"),  # bidi marks
        ("a\u2028b\u2029c", "a\\u2028b\\u2029c"),  # line and paragraph separators
        ("raw \udcff byte", "raw \\udcff byte"),  # a byte that was no UTF-8 (surrogateescape)
    ],
)
def test_what_a_terminal_would_obey_is_written_out(raw: str, shown: str) -> None:
    assert visible(raw) == shown
    assert all(char.isprintable() for char in visible(raw))


def test_tab_newline_other_scripts_and_emoji_are_shown_as_they_are() -> None:
    text = "loss\t0.25\nÉpoque 3 — 精度 99% 😀 ✓ \\x1b (a log's own backslash)"
    assert visible(text) == text


def test_a_newline_is_written_out_where_one_line_must_stay_one() -> None:
    assert visible("a\nb\tc", newlines=False) == "a\\nb\tc"


def test_written_out_twice_is_written_out_once() -> None:
    raw = "".join(chr(code) for code in range(0x00, 0xA0)) + "\u202e\u2066\udc80"
    once = visible(raw)
    assert visible(once) == once
    one_line = visible(raw, newlines=False)
    assert visible(one_line, newlines=False) == one_line and "\n" not in one_line


def test_lines_come_with_their_numbers_and_a_last_one_without_its_newline() -> None:
    found = list(lines(io.BytesIO(b"a\n\nbc\nlast"), 10))
    assert found == [Line(1, b"a"), Line(2, b""), Line(3, b"bc"), Line(4, b"last", ended=False)]


def test_a_line_longer_than_the_bound_is_cut_and_the_rest_skipped_in_pieces() -> None:
    class Counting(io.BytesIO):
        most = 0

        def readline(self, size: int | None = -1) -> bytes:
            data = super().readline(size)
            Counting.most = max(Counting.most, len(data))
            return data

    handle = Counting(b"x" * 1_000_000 + b"\nnext\n")
    assert list(lines(handle, 100)) == [Line(1, b"x" * 100, cut=True), Line(2, b"next")]
    assert Counting.most <= 64 * 1024  # never the enormous line at once


def test_a_cut_line_at_the_file_s_end_is_the_last() -> None:
    assert list(lines(io.BytesIO(b"ok\n" + b"y" * 50), 10)) == [
        Line(1, b"ok"),
        Line(2, b"y" * 10, cut=True, ended=False),
    ]


def test_reading_stops_at_the_byte_bound() -> None:
    handle = io.BytesIO(b"aaaa\nbbbb\ncccc\n")
    assert list(lines(handle, 100, max_bytes=7)) == [Line(1, b"aaaa"), Line(2, b"bb", ended=False)]
    assert handle.tell() == 7
    long = io.BytesIO(b"z" * 500 + b"\nafter\n")
    assert list(lines(long, 10, max_bytes=100)) == [Line(1, b"z" * 10, cut=True, ended=False)]
    assert long.tell() == 100


def test_help_texts_show_names_not_sphinx_markup() -> None:
    doc = (
        "Run ``python -m x``: see :func:`ddp_cluster.job.plot.main`, :mod:`~ddp_cluster.runtime.run`,"
        " :class:`Job <a.b.Job>`."
    )
    assert plain(doc) == "Run python -m x: see ddp_cluster.job.plot.main, run, Job."
    assert plain(None) == ""


@pytest.mark.parametrize(
    "argv", [["-m", "ddp_cluster.run", "--help"], ["-m", "ddp_cluster.cli", "plot", "--help"]]
)
def test_the_help_of_user_commands_holds_no_markup(argv: list[str]) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and "``" not in done.stdout and ":func:`" not in done.stdout
