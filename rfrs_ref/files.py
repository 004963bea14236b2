"""Files written so that a reader, or a run killed half-way, never sees half of one."""

from __future__ import annotations

import os
import pathlib
from typing import Callable, IO


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(fh)`` on a temporary file beside ``path``, flush it to disk,
    then rename it over ``path`` (atomic on POSIX): ``path`` holds the old
    content or the new, never part of it. The temporary name carries the
    process id, so concurrent writers do not share one."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
