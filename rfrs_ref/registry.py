"""A small name -> object registry, one per family (models, optimisers, rules, attacks, datasets).

The command line builds its choices from these registries, so registering an
entry is all it takes to make it selectable from ``rfrs-ref``.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Ordered mapping of names to entries of one family.

    >>> r = Registry("colour")
    >>> @r.register("red")
    ... class Red: pass
    >>> r.get("red") is Red
    True
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; usable as a decorator when ``obj`` is omitted."""

        def _add(o: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.family} {name!r} is already registered")
            self._entries[name] = o
            return o

        return _add if obj is None else _add(obj)

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.family} {name!r}; choose one of: {', '.join(self._entries)}"
            ) from None

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self):
        return self._entries.items()

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}, {self.names()})"
