"""Strict, fast readers of the text formats the datasets come in.

Two layouts cover the four datasets (docs/datasets.md):

- tab-separated integer tables (``user_artists.dat`` with its header
  ``userID artistID weight``; ``u.data`` without header: ``user item rating
  timestamp``);
- count lists (citeulike ``users.dat``): line u is ``count id id ...`` with
  exactly ``count`` ids separated by spaces.

Every field must be a non-negative decimal integer. Lines end in ``\\n`` or
``\\r\\n`` (lastfm uses the latter); the last line may lack its newline; an
empty line is an error.

Speed and precise errors are obtained together: the whole file is checked and
parsed with vectorised NumPy operations over its bytes (tens of milliseconds
for the 2 MB ``u.data``), which also yields a per-line verdict; when a line is bad, only that
line is decoded and diagnosed in Python to say what was expected and what was
found. Errors are :class:`~rfrs_ref.data.errors.DatasetFormatError` naming the
file and the 1-based line number.
"""

from __future__ import annotations

import dataclasses
import os
import re

import numpy as np

from rfrs_ref.data.errors import DatasetFormatError

_NL, _TAB, _SPACE, _ZERO, _NINE = 10, 9, 32, 48, 57
# int64 holds every 18-digit decimal; longer tokens are rejected as out of range
_MAX_DIGITS = 18
_DIGITS = re.compile(r"[0-9]+")


def _show(text: str, limit: int = 60) -> str:
    """A line as it appears in messages: repr, shortened."""
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text)} characters)"
    return repr(text)


def _fmt(n: int) -> str:
    return f"{n:,}"


@dataclasses.dataclass(frozen=True)
class _Lines:
    """A file's bytes with ``\\r\\n`` normalised, and where its lines start."""

    path: str
    data: np.ndarray  # uint8 view of the normalised bytes
    raw: bytes  # the normalised bytes
    starts: np.ndarray  # int64 byte offset of each line
    ends: np.ndarray  # int64 byte offset one past each line's last character
    first_line: int  # 1-based number of the first line held here

    @property
    def n_lines(self) -> int:
        return int(self.starts.shape[0])

    def text(self, k: int) -> str:
        """Line k (0-based within this block), decoded for a message."""
        return self.raw[self.starts[k] : self.ends[k]].decode("utf-8", errors="replace")

    def line_number(self, k: int) -> int:
        return self.first_line + int(k)

    def line_of_offset(self, pos: np.ndarray) -> np.ndarray:
        """0-based line index (within this block) of each byte offset."""
        return np.searchsorted(self.starts, pos, side="right") - 1


def _split_lines(path: str, raw: bytes, first_line: int = 1) -> _Lines:
    if b"\r" in raw:
        normalised = raw.replace(b"\r\n", b"\n")
        cr = normalised.find(b"\r")
        if cr >= 0:
            line = first_line + normalised.count(b"\n", 0, cr)
            raise DatasetFormatError(
                path, line, "lines ending in \\n or \\r\\n",
                "a carriage return inside the line",
            )
        raw = normalised
    data = np.frombuffer(raw, dtype=np.uint8)
    newlines = np.flatnonzero(data == _NL).astype(np.int64)
    if data.size == 0:
        starts = np.zeros(0, np.int64)
        ends = np.zeros(0, np.int64)
    elif raw.endswith(b"\n"):
        ends = newlines
        starts = np.concatenate(([0], newlines[:-1] + 1))
    else:
        ends = np.concatenate((newlines, [data.size]))
        starts = np.concatenate(([0], newlines + 1))
    return _Lines(path, data, raw, starts, ends, first_line)


@dataclasses.dataclass(frozen=True)
class _Tokens:
    values: np.ndarray  # int64 value of each token, in file order
    per_line: np.ndarray  # int64 number of tokens on each line
    bad_line: np.ndarray  # bool, a line holding a character other than digits and separators


def _tokenize(lines: _Lines, separator: int) -> _Tokens:
    """Split on ``separator`` (and newlines) and parse every run of digits.

    A run longer than 18 digits is marked bad (it would overflow int64); so is
    any byte that is neither a digit, the separator nor a newline.
    """
    a = lines.data
    is_digit = (a >= _ZERO) & (a <= _NINE)
    other = ~(is_digit | (a == separator) | (a == _NL))
    bad_line = np.zeros(lines.n_lines, dtype=bool)
    if other.any():
        bad_line[lines.line_of_offset(np.flatnonzero(other))] = True

    edges = np.diff(is_digit.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    tok_start = np.flatnonzero(edges == 1)
    tok_end = np.flatnonzero(edges == -1)
    length = tok_end - tok_start
    tok_line = lines.line_of_offset(tok_start)
    too_long = length > _MAX_DIGITS
    if too_long.any():
        bad_line[tok_line[too_long]] = True
        length = np.minimum(length, _MAX_DIGITS)

    # Horner's rule over digit positions, all tokens at once.
    values = np.zeros(tok_start.shape[0], dtype=np.int64)
    for k in range(int(length.max()) if length.size else 0):
        live = length > k
        idx = tok_start[live] + k
        values[live] = values[live] * 10 + (a[idx].astype(np.int64) - _ZERO)
    per_line = np.bincount(tok_line, minlength=lines.n_lines).astype(np.int64)
    return _Tokens(values, per_line, bad_line)


# --- tab-separated integer tables --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of a tab-separated integer table.

    Attributes:
        path: the file.
        values: int64 array (n_rows, n_fields).
        first_line: 1-based line number of row 0 (2 when there is a header).
    """

    path: str
    values: np.ndarray
    first_line: int

    def line_of(self, row: int) -> int:
        return self.first_line + int(row)


def _diagnose_tab_line(text: str, fields: tuple[str, ...]) -> tuple[str, str]:
    n = len(fields)
    want = f"{n} tab-separated integer fields ({', '.join(fields)})"
    if text == "":
        return want, "an empty line"
    parts = text.split("\t")
    if len(parts) != n:
        return want, f"{len(parts)} field{'s' if len(parts) != 1 else ''}: {_show(text)}"
    for name, part in zip(fields, parts, strict=True):
        if not _DIGITS.fullmatch(part):
            return f"a non-negative integer for {name}", f"{_show(part)} in line {_show(text)}"
        if len(part) > _MAX_DIGITS:
            return f"{name} to fit in 64 bits", f"{_show(part)}"
    return want, _show(text)  # unreachable when the vectorised check is right


def read_table(
    path: str | os.PathLike,
    fields: tuple[str, ...],
    *,
    header: str | None = None,
    n_rows: int | None = None,
    raw: bytes | None = None,
) -> Table:
    """Read a tab-separated table of non-negative integers.

    Args:
        path: the file (also the name used in errors).
        fields: the column names, in order (used in errors).
        header: the exact first line (without line ending), or None when the
            file has no header.
        n_rows: the exact number of data rows expected, or None.
        raw: the file's bytes when already read (to hash and parse one read).

    Returns:
        the rows, int64 (n_rows, len(fields)).

    Raises:
        DatasetFormatError: missing or wrong header, an empty line, a line
            without exactly ``len(fields)`` non-empty fields, a field that is not
            a non-negative integer, a row count other than ``n_rows``.
    """
    path = os.fspath(path)
    if raw is None:
        with open(path, "rb") as fh:
            raw = fh.read()
    first_line = 1
    if header is not None:
        cut = raw.find(b"\n")
        head = raw if cut < 0 else raw[:cut]
        head = head[:-1] if head.endswith(b"\r") else head
        if head != header.encode("utf-8"):
            found = _show(head.decode("utf-8", errors="replace")) if raw else "an empty file"
            raise DatasetFormatError(path, 1, f"the header {_show(header)}", found)
        raw = b"" if cut < 0 else raw[cut + 1 :]
        first_line = 2
    lines = _split_lines(path, raw, first_line)
    n = len(fields)
    tok = _tokenize(lines, _TAB)
    tabs_per_line = np.bincount(
        lines.line_of_offset(np.flatnonzero(lines.data == _TAB)), minlength=lines.n_lines
    )
    bad = tok.bad_line | (tok.per_line != n) | (tabs_per_line != n - 1)
    if bad.any():
        k = int(np.argmax(bad))
        expected, found = _diagnose_tab_line(lines.text(k), fields)
        raise DatasetFormatError(path, lines.line_number(k), expected, found)
    if n_rows is not None:
        check_line_count(path, first_line, lines.n_lines, n_rows, "data lines")
    return Table(path, tok.values.reshape(lines.n_lines, n), first_line)


def check_line_count(path: str, first_line: int, n_found: int, expected: int, what: str) -> None:
    """Raise DatasetFormatError unless a block of lines starting at ``first_line`` has
    exactly ``expected`` lines (``what`` names them in the message)."""
    if n_found == expected:
        return
    if n_found < expected:
        raise DatasetFormatError(
            path, first_line + n_found,
            f"{_fmt(expected)} {what} (through line {_fmt(first_line + expected - 1)})",
            f"the end of the file after {_fmt(n_found)} {what}: the file is truncated",
        )
    raise DatasetFormatError(
        path, first_line + expected,
        f"the end of the file after {_fmt(expected)} {what}",
        f"{_fmt(n_found - expected)} more line(s)",
    )


# --- count lists (citeulike users.dat) ---------------------------------------------


@dataclasses.dataclass(frozen=True)
class CountLists:
    """Per-line id lists of a count-list file.

    Attributes:
        path: the file.
        indptr: int64 (n_lines + 1,); line k's ids are ``ids[indptr[k]:indptr[k+1]]``.
        ids: int64 ids in file order (the count fields removed).
    """

    path: str
    indptr: np.ndarray
    ids: np.ndarray


def _diagnose_count_line(text: str) -> tuple[str, str]:
    want = "a count followed by that many space-separated item ids"
    parts = [p for p in text.split(" ") if p != ""]
    if not parts:
        return want, "an empty line"
    for k, part in enumerate(parts):
        if not _DIGITS.fullmatch(part):
            what = "the count" if k == 0 else "item ids"
            return f"a non-negative integer for {what}", f"{_show(part)} (token {k + 1})"
        if len(part) > _MAX_DIGITS:
            return "integers that fit in 64 bits", _show(part)
    count = int(parts[0])
    return (
        f"{_fmt(count)} item id{'s' if count != 1 else ''} after the count {count}",
        f"{_fmt(len(parts) - 1)}: the line is truncated or its count is wrong",
    )


def read_count_lists(
    path: str | os.PathLike, *, n_lines: int | None = None, raw: bytes | None = None
) -> CountLists:
    """Read a count-list file: line k is ``c id_1 ... id_c``.

    Args:
        path: the file (also the name used in errors).
        n_lines: the exact number of lines expected (users), or None.
        raw: the file's bytes when already read.

    Raises:
        DatasetFormatError: an empty line, a token that is not a non-negative
            integer, a count that differs from the number of ids that follow it
            (a truncated line), a line count other than ``n_lines``.
    """
    path = os.fspath(path)
    if raw is None:
        with open(path, "rb") as fh:
            raw = fh.read()
    lines = _split_lines(path, raw)
    tok = _tokenize(lines, _SPACE)
    # the first token of each non-empty line is its count
    first = np.zeros(lines.n_lines + 1, dtype=np.int64)
    np.cumsum(tok.per_line, out=first[1:])
    nonempty = tok.per_line > 0
    counts = np.full(lines.n_lines, -1, dtype=np.int64)
    counts[nonempty] = tok.values[first[:-1][nonempty]]
    bad = tok.bad_line | ~nonempty | (counts != tok.per_line - 1)
    if bad.any():
        k = int(np.argmax(bad))
        expected, found = _diagnose_count_line(lines.text(k))
        raise DatasetFormatError(path, lines.line_number(k), expected, found)
    if n_lines is not None:
        check_line_count(path, 1, lines.n_lines, n_lines, "lines")
    is_count = np.zeros(tok.values.shape[0], dtype=bool)
    is_count[first[:-1]] = True
    ids = tok.values[~is_count]
    indptr = np.zeros(lines.n_lines + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return CountLists(path, indptr, ids)


# --- item names ----------------------------------------------------------------------


def read_names(
    path: str | os.PathLike, *, separator: str, encoding: str, header: str | None = None,
    name_field: int = 1,
) -> dict[int, str]:
    """Read an item-name file: integer id in field 0, the name in ``name_field``.

    Used for ``artists.dat`` (tab separated, header ``id name url pictureURL``,
    UTF-8) and ``u.item`` (``|`` separated, ISO-8859-1 or ASCII).

    Returns:
        raw id -> name.

    Raises:
        DatasetFormatError: wrong header, a line with too few fields or a
            non-integer id, an id given twice.
    """
    path = os.fspath(path)
    with open(path, "rb") as fh:
        text = fh.read().decode(encoding, errors="replace")
    lines = text.splitlines()
    first = 1
    if header is not None:
        if not lines or lines[0] != header:
            raise DatasetFormatError(path, 1, f"the header {_show(header)}",
                                     _show(lines[0]) if lines else "an empty file")
        lines = lines[1:]
        first = 2
    names: dict[int, str] = {}
    for k, line in enumerate(lines):
        parts = line.split(separator)
        if len(parts) <= name_field:
            raise DatasetFormatError(
                path, first + k, f"at least {name_field + 1} {separator!r}-separated fields",
                f"{len(parts)}: {_show(line)}",
            )
        if not _DIGITS.fullmatch(parts[0]):
            raise DatasetFormatError(path, first + k, "an integer item id in field 1",
                                     _show(parts[0]))
        item = int(parts[0])
        if item in names:
            raise DatasetFormatError(path, first + k, "each item id once", f"id {item} again")
        names[item] = parts[name_field]
    return names
