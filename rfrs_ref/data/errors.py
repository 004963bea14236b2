"""Errors of the data family, written for the person who has to fix the file."""

from __future__ import annotations

import os


class DatasetFormatError(ValueError):
    """A dataset file does not have the expected format or content.

    The message names the file, the 1-based line number where the problem was
    found (when there is one), what was expected and what was found, e.g.::

        /data/ml-100k/u.data:17: expected 4 tab-separated fields, found 3: '196\\t242\\t3'

    Attributes:
        path: the file.
        line: 1-based line number, or None for a whole-file problem (counts, checksum).
        expected, found: the two halves of the message.
    """

    def __init__(self, path: str | os.PathLike, line: int | None, expected: str, found: str):
        self.path = os.fspath(path)
        self.line = line
        self.expected = expected
        self.found = found
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: expected {expected}, found {found}")


class DownloadError(OSError):
    """A download failed, was interrupted, or did not match its pinned sha256.

    Nothing is left behind in the destination when this is raised: files are
    written to temporary names and renamed only once verified.

    Attributes:
        url: the URL that was downloaded.
        file: the file concerned (a member of an archive, or the URL's file), or None.
        expected, actual: sha256 digests when the failure is a checksum mismatch, else None.
    """

    def __init__(self, message: str, *, url: str, file: str | None = None,
                 expected: str | None = None, actual: str | None = None):
        self.url = url
        self.file = file
        self.expected = expected
        self.actual = actual
        super().__init__(message)

    def __str__(self) -> str:  # OSError's own __str__ would show errno fields
        return self.args[0]


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is not present in any searched directory and downloading was not allowed."""

    def __str__(self) -> str:
        return self.args[0]
