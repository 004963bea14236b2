"""Reading files that someone else wrote: JSON, .npy arrays, and paths they name.

The checking tools (golden vectors, traces, the conformance suite) read files
produced by other implementations, by older versions, or by nobody in
particular. Everything in them is input: a binary file where JSON is expected,
JSON nested 100,000 deep, a number with 5,000 digits, an array header that
claims a terabyte, a path that climbs out of its folder. Each of these becomes
one :class:`UntrustedFileError` (a ``ValueError``) whose message is one line
naming the file (and line, where there is one), what is wrong and what to do,
never a traceback.

Paths read from such a file are confined to a folder (:func:`confined`): a
relative path without ``..``, which still lies inside the folder once symbolic
links are resolved.

The conformance suite also runs code someone else wrote, and names what it
raised or returned: :func:`describe_exception`, :func:`exception_message` and
:func:`describe_object` never raise, whatever that code's ``__str__``, ``__repr__`` or ``__getattr__``
do, and cut what they print to one short line.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
from typing import Any

import numpy as np


class UntrustedFileError(ValueError):
    """A file handed to a checking tool cannot be used (the message names the file)."""


def _guarded_text(render, obj, limit: int) -> str:
    """``render(obj)`` as one line of at most ``limit`` characters, or a note saying why not."""
    try:
        text = render(obj)
        if not isinstance(text, str):
            raise TypeError(f"returned {type(text).__name__}")
    except BaseException as exc:  # noqa: BLE001 - the code is input; even exit() here is its answer
        try:
            why = type(exc).__name__
        except BaseException:  # noqa: BLE001
            why = "an exception"
        return f"<{render.__name__}() raised {why}>"
    lines = text.splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit] + "…"


def _type_name(obj) -> str:
    try:
        name = type(obj).__name__
        return name if isinstance(name, str) else "object"
    except BaseException:  # noqa: BLE001 - a metaclass may define __name__ as it likes
        return "object"


def describe_exception(exc: BaseException, limit: int = 300) -> str:
    """``Name: first line of the message``, or ``Name`` when the message is empty.

    ``exc`` was raised by code under test: its ``__str__`` may raise (then the
    message says so), return a megabyte (then it is cut to ``limit``
    characters) or span lines (then the first is kept). Never raises.
    """
    msg = exception_message(exc, limit)
    name = _type_name(exc)
    return f"{name}: {msg}" if msg else name


def exception_message(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``str(exc)``, as :func:`describe_exception` prints it after the name."""
    return _guarded_text(str, exc, limit)


def one_line(text: str) -> str:
    """``text`` with every character that does not print as itself (a newline, a carriage
    return, U+2028, a terminal escape, other control and format characters) written as its
    Python escape (``\\n``, ``\\u2028``): a name read from a file (a JSON key, an array name)
    must not split a one-line report, nor forge a line of its own in it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def describe_object(obj, limit: int = 120) -> str:
    """The first line of ``repr(obj)``, cut to ``limit`` characters; never raises (an object
    of code under test may define ``__repr__`` as it likes)."""
    return _guarded_text(repr, obj, limit)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """``object_pairs_hook`` of :func:`parse_json`: a dict, or :class:`_DuplicateKey`."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


def parse_json(text: str | bytes, where: str) -> Any:
    """Parse one JSON document; every failure is an :class:`UntrustedFileError` naming ``where``.

    ``NaN``, ``Infinity`` and ``-Infinity`` (which Python's json module writes
    unless told not to) are accepted as the floats they name, and a literal too
    large for a float (``1e999``) reads as ±inf: the tools compare such values
    by the rule of :mod:`rfrs_ref.agreement` instead of refusing the file.

    Refused: an object with the same key twice (JSON readers disagree on which
    value wins, so a file could show one value to a person's viewer and
    another to this tool), a leading UTF-8 byte order mark (the files are
    UTF-8 without one; the message says so instead of Python's advice), and a
    string holding a lone UTF-16 surrogate (``"\\ud800"``: half of a ``\\uXXXX``
    pair, no character, which no report printing it as UTF-8 could write).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UntrustedFileError(f"{where}: not UTF-8 text (byte {exc.start}): "
                                     "is it a binary file?") from None
    if text.startswith("\ufeff"):
        raise UntrustedFileError(f"{where}: starts with a UTF-8 byte order mark (BOM); save it "
                                 "as UTF-8 without one")
    try:
        obj = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise UntrustedFileError(f"{where}: duplicate key {exc.key!r} in one JSON object "
                                 "(readers disagree on which value wins); keep one") from None
    except json.JSONDecodeError as exc:
        raise UntrustedFileError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                                 f"column {exc.colno})") from None
    except RecursionError:
        raise UntrustedFileError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer beyond Python's int-string conversion limit
        msg = str(exc).split(";")[0].split("\n")[0]
        raise UntrustedFileError(f"{where}: unreadable JSON number ({msg})") from None
    if _SURROGATE.search(text) and _lone_surrogate(obj):
        m = _LONE_ESCAPE.search(text)
        at = (f" (at line {text.count(chr(10), 0, m.start()) + 1}, column "
              f"{m.start() - text.rfind(chr(10), 0, m.start())})") if m else ""
        raise UntrustedFileError(f"{where}: a string holds a lone UTF-16 surrogate{at}, half of a "
                                 "\\uXXXX pair and no character: write the text as UTF-8, or "
                                 "escape both halves of the pair")
    return obj


#: a surrogate, escaped (\ud800) or not: a fast test before :func:`_lone_surrogate`
_SURROGATE = re.compile(r"[\ud800-\udfff]|\\u[dD][89a-fA-F]")
#: an escaped high surrogate not followed by a low one, or a low one not preceded by a high one
_LONE_ESCAPE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
                          r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _lone_surrogate(obj: Any) -> bool:
    """Whether a string (a key or a value) of parsed JSON holds a surrogate code point: one
    that JSON's ``\\uXXXX`` escapes left unpaired, which no UTF-8 output can print."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False


def read_json(path, what: str = "file", *, max_bytes: int | None = None) -> Any:
    """Read and parse a JSON file (see :func:`parse_json`); a missing or unreadable file
    is an :class:`UntrustedFileError` too, and so is one of more than ``max_bytes`` bytes
    (judged from the size of the file opened, before a byte is read: a sparse file of
    terabytes takes a few bytes of disk, and reading it whole would take all memory)."""
    from rfrs_ref.files import open_input

    path = pathlib.Path(path)
    if path.is_dir():
        raise UntrustedFileError(f"{path}: is a directory, expected a {what}")
    try:
        # opened without waiting, then tested on the descriptor itself: a FIFO or a device
        # (/dev/zero) put at the name after a test of the name would be read for ever
        with open_input(path, what) as fh:
            size = os.fstat(fh.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                raise UntrustedFileError(f"{path}: {size:,} bytes, more than the {max_bytes:,} "
                                         f"bytes this {what} may hold; nothing is read from it")
            data = fh.read()
    except FileNotFoundError:
        raise UntrustedFileError(f"{path}: no such {what}") from None
    except UntrustedFileError:
        raise
    except ValueError:
        raise UntrustedFileError(f"{path}: not a regular file, expected a {what}") from None
    except OSError as exc:
        raise UntrustedFileError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    return parse_json(data, str(path))


def depth_exceeds(obj: Any, limit: int) -> bool:
    """Whether ``obj`` (parsed JSON or TOML) nests lists (or tuples) and objects (mappings)
    more than ``limit`` deep (iterative: safe on any depth the parser accepted)."""
    from collections.abc import Mapping

    stack = [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, Mapping):
            x = list(x.values())
        elif not isinstance(x, (list, tuple)):
            continue
        if d > limit:
            return True
        stack.extend((v, d + 1) for v in x if isinstance(v, (Mapping, list, tuple)))
    return False


def confined(folder, relative, source: str, *, what: str = "path") -> pathlib.Path:
    """``folder / relative``, resolved, provided it stays inside ``folder``.

    ``relative`` comes from the file ``source`` (named in the message). Refused:
    anything but a non-empty string; an absolute path (``/x``, ``C:\\x``, ``\\\\host``);
    a ``..`` component; a NUL character; a path that leaves ``folder``
    once symbolic links are resolved; and one whose links cannot be resolved (a loop).
    """
    if not isinstance(relative, str) or not relative:
        raise UntrustedFileError(f"{source}: {what} {relative!r} is not a relative file path")
    if "\x00" in relative:
        raise UntrustedFileError(f"{source}: {what} {relative!r} contains a NUL character")
    pure = pathlib.PurePosixPath(relative.replace("\\", "/"))
    if pure.is_absolute() or (len(relative) > 1 and relative[1] == ":"):
        raise UntrustedFileError(f"{source}: {what} {relative!r} is absolute; paths in this file "
                                 "must be relative to its folder")
    if ".." in pure.parts:
        raise UntrustedFileError(f"{source}: {what} {relative!r} climbs out of its folder ('..'); "
                                 "paths in this file must stay inside it")
    try:
        base = pathlib.Path(folder).resolve()
        target = (base / pure).resolve()
    except (RuntimeError, OSError) as exc:  # a link loop (RuntimeError before Python 3.13)
        raise UntrustedFileError(f"{source}: {what} {relative!r} cannot be resolved: a symbolic "
                                 f"link loop or an unreadable folder ({exc})") from None
    if target != base and base not in target.parents:
        raise UntrustedFileError(f"{source}: {what} {relative!r} leads outside {base} (through a "
                                 "symbolic link); paths in this file must stay inside its folder")
    return target


#: dtype kinds an .npy file of the checking tools may hold: float, signed/unsigned integer, bool
NPY_KINDS = "fiub"


def read_npy(path, source: str | None = None, *, strict: bool = False,
             max_bytes: int | None = None) -> np.ndarray:
    """Read one ``.npy`` array (never pickled), refusing what NumPy would choke on.

    The header's dtype must be a plain float, integer or bool, and the file must
    hold as many bytes as the header's shape needs (a header claiming more than
    the file holds is refused before any memory is allocated). ``source`` names
    the file that pointed here, for the message.

    By default any layout NumPy writes is read (format version 1.0, 2.0 or 3.0,
    C or Fortran order, either byte order), and the array is returned in C order.
    ``strict``: the file must also have the one layout a reader written from the
    format's description alone handles, which the golden vectors fix: format
    version 1.0, C order (``'fortran_order': False``) and a little-endian dtype
    (``<``, or ``|`` where byte order does not apply); any other is refused, naming
    what differs, even where NumPy would read the same values. ``max_bytes``: the most data
    the array may hold; a header claiming more is refused before any memory is allocated.

    Refused whatever ``strict`` says, because readers disagree on what such a file holds:
    a header (a Python dict literal) that repeats a key (NumPy keeps the last value, a
    reader of the text may take the first), and a bool array holding a byte other than 0
    or 1 (NumPy reads byte 2 as True, a reader comparing bytes or a C ``bool`` may not);
    the message names the key, or the byte and the index of the first such element.
    """
    path = pathlib.Path(path)
    where = f"{path}" + (f" (named in {source})" if source else "")
    if path.exists() and not path.is_dir() and not path.is_file():
        raise UntrustedFileError(f"{where}: not a regular file, expected an .npy file")
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise UntrustedFileError(f"{where}: no such array file") from None
    except IsADirectoryError:
        raise UntrustedFileError(f"{where}: is a directory, expected an .npy file") from None
    except OSError as exc:
        raise UntrustedFileError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    with fh:
        try:
            version = np.lib.format.read_magic(fh)
            start = fh.tell()
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ValueError(f"format version {version}")
        except (ValueError, SyntaxError, TypeError, OverflowError, EOFError) as exc:
            msg = str(exc).split("\n")[0]
            raise UntrustedFileError(f"{where}: not a readable .npy file ({msg})") from None
        _check_header_keys(fh, start, version, where)
        if dtype.kind not in NPY_KINDS or dtype.hasobject or dtype.fields is not None:
            raise UntrustedFileError(f"{where}: dtype {dtype} is not a plain float, integer or bool")
        if strict:
            off = [x for x, bad in ((f"format version {version[0]}.{version[1]}", version != (1, 0)),
                                    ("Fortran (column-major) order", fortran),
                                    (f"big-endian ({dtype.str!r})", dtype.str[0] not in "<|")) if bad]
            if off:
                raise UntrustedFileError(f"{where}: not in the plain .npy layout (format version 1.0, "
                                         f"C order, little-endian): it has {', '.join(off)}; write it "
                                         "with numpy.save from a C-ordered, little-endian array")
        if any(s < 0 for s in shape):  # NumPy's header check allows them; reshape does not
            raise UntrustedFileError(f"{where}: the header's shape {tuple(shape)} has a negative "
                                     "dimension")
        count = 1
        for s in shape:
            count *= int(s)
        need = count * dtype.itemsize
        if max_bytes is not None and need > max_bytes:
            raise UntrustedFileError(f"{where}: the header's shape {tuple(shape)} of {dtype} holds "
                                     f"{need:,} bytes, more than the {max_bytes:,} such an array "
                                     "may hold; nothing is read from it")
        have = os.fstat(fh.fileno()).st_size - fh.tell()
        if need != have:
            raise UntrustedFileError(f"{where}: the header's shape {tuple(shape)} of {dtype} needs "
                                     f"{need} bytes of data, the file holds {have}")
        raw = fh.read(need)
        order = "F" if fortran else "C"
        if dtype.kind == "b":
            _check_bool_bytes(raw, tuple(shape), order, where)
        data = np.frombuffer(raw, dtype=dtype, count=count)
    return data.reshape(shape, order=order).copy()


def _check_header_keys(fh, start: int, version: tuple, where: str) -> None:
    """Refuse an .npy header that NumPy read but whose dict literal repeats a key.

    NumPy evaluates the header (``{'descr': ..., 'fortran_order': ..., 'shape': ...}``)
    as a Python literal, whose last value of a repeated key wins: ``'shape': (2,),
    'shape': (4,)`` is read as (4,), a reader of the text may take (2,). The header's
    text (``fh`` from ``start``, just after the magic string, to where NumPy stopped) is
    parsed again, and its keys compared; ``fh`` is left where NumPy left it.
    """
    end = fh.tell()
    fh.seek(start)
    size = 2 if version == (1, 0) else 4
    text = fh.read(end - start)[size:].decode("utf-8" if version == (3, 0) else "latin1")
    fh.seek(end)
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        # NumPy read it after dropping Python 2's long suffixes (3L): so does this check
        try:
            node = ast.parse(re.sub(r"(?<=\d)[lL]\b", "", text.strip()), mode="eval").body
        except SyntaxError:
            raise UntrustedFileError(f"{where}: the .npy header is not a dict literal whose "
                                     "keys can be checked") from None
    if not isinstance(node, ast.Dict):
        raise UntrustedFileError(f"{where}: the .npy header is not a dict literal")
    seen: set = set()
    for key in node.keys:
        value = key.value if isinstance(key, ast.Constant) else None
        if value in seen:
            raise UntrustedFileError(f"{where}: the .npy header repeats key {value!r} (NumPy keeps "
                                     "the last value, other readers may take the first); write "
                                     "each key once")
        seen.add(value)


def _check_bool_bytes(raw: bytes, shape: tuple, order: str, where: str) -> None:
    """Refuse bool data holding a byte other than 0 or 1, naming the first such element's
    index in ``shape`` (``order``: the file's order of elements) and its byte."""
    b = np.frombuffer(raw, dtype=np.uint8)
    bad = np.flatnonzero(b > 1)
    if bad.size:
        i = int(bad[0])
        index = tuple(int(x) for x in np.unravel_index(i, shape, order=order)) if shape else ()
        raise UntrustedFileError(f"{where}: bool array holds byte {int(b[i])} at index {index}, a "
                                 f"bool is 0 or 1 ({bad.size} such byte{'s' if bad.size > 1 else ''}; "
                                 "readers disagree on what it means)")


__all__ = ["NPY_KINDS", "UntrustedFileError", "confined", "depth_exceeds", "one_line", "parse_json",
           "read_json", "read_npy"]
