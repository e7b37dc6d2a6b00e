"""Fixed-width little-endian metadata layouts.

A layout is a list of ``(field_name, struct_code)`` pairs in wire order; a name of
``None`` marks a reserved field. Two ``struct.Struct`` objects come out of it:

* the *pack* struct writes reserved fields as pad bytes (always zero), so encoding
  is one ``pack`` call over the named fields;
* the *unpack* struct reads reserved fields as integers, so decoding can reject any
  non-zero reserved value (nnrp-wire.md section 0: "A receiver MUST reject them").
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from ._constants import ErrorCode
from ._errors import RemoteProtocolError

_SIZES = {"B": 1, "b": 1, "H": 2, "h": 2, "I": 4, "i": 4, "Q": 8, "q": 8}

Field = tuple[str | None, str]


class Layout:
    """Precompiled pack/unpack machinery for one metadata layout."""

    __slots__ = ("_named", "_pick", "_reserved", "fields", "get_values", "names", "pack_struct",
                 "size", "unpack_struct")

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = tuple(fields)
        pack_fmt = ["<"]
        unpack_fmt = ["<"]
        names: list[str] = []
        named_idx: list[int] = []
        reserved_idx: list[int] = []
        for index, (name, code) in enumerate(self.fields):
            unpack_fmt.append(code)
            if name is None:
                pack_fmt.append(f"{_SIZES[code]}x")
                reserved_idx.append(index)
            else:
                pack_fmt.append(code)
                names.append(name)
                named_idx.append(index)
        self.pack_struct = struct.Struct("".join(pack_fmt))
        self.unpack_struct = struct.Struct("".join(unpack_fmt))
        self.size = self.pack_struct.size
        self.names = tuple(names)
        self._reserved = tuple(reserved_idx)
        self._named = tuple(named_idx)
        pick: Callable[[tuple[int, ...]], Any]
        if len(named_idx) == 1:
            only = named_idx[0]
            pick = lambda values: (values[only],)  # noqa: E731
        elif named_idx:
            pick = operator.itemgetter(*named_idx)
        else:
            pick = lambda values: ()  # noqa: E731
        self._pick = pick
        get_values: Callable[[object], Any]
        if len(names) == 1:
            only_name = names[0]
            get_values = lambda message: (getattr(message, only_name),)  # noqa: E731
        elif names:
            get_values = operator.attrgetter(*names)
        else:
            get_values = lambda message: ()  # noqa: E731
        #: Named field values of a message object, in wire order (for ``pack_struct``).
        self.get_values = get_values

    def unpack(self, buffer: bytes | bytearray | memoryview, offset: int, what: str
               ) -> tuple[int, ...]:
        """Named field values, after checking every reserved field is zero."""
        values = self.unpack_struct.unpack_from(buffer, offset)
        for index in self._reserved:
            if values[index]:
                raise RemoteProtocolError(
                    f"{what}: reserved field at byte {self._offset_of(index)} is "
                    f"{values[index]:#x}, must be 0", code=ErrorCode.MALFORMED_BODY)
        picked: tuple[int, ...] = self._pick(values)
        return picked

    def _offset_of(self, index: int) -> int:
        return sum(_SIZES[code] for _, code in self.fields[:index])


class HasLayout(Protocol):
    LAYOUT: ClassVar[Layout]


T = TypeVar("T")


def check_mask(value: int, mask: int, what: str) -> None:
    """Reject bits outside ``mask`` (reserved bits must be zero)."""
    if value & ~mask:
        raise RemoteProtocolError(f"{what}: reserved bits {value & ~mask:#x} set",
                                  code=ErrorCode.MALFORMED_BODY)


def check_range(value: int, allowed: range | frozenset[int], what: str) -> None:
    """Reject a value outside its registry."""
    if value not in allowed:
        raise RemoteProtocolError(f"{what}: value {value} is not defined",
                                  code=ErrorCode.MALFORMED_BODY)


def check(condition: bool, message: str) -> None:
    """Reject a metadata rule violation with a MALFORMED_BODY error."""
    if not condition:
        raise RemoteProtocolError(message, code=ErrorCode.MALFORMED_BODY)
