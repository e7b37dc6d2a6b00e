"""Fixed-width little-endian metadata, declared once per wire field.

A message class lists its metadata fields in wire order, each declared exactly once
with its struct code and, where the spec has one, its registry::

    @message(MsgType.SESSION_CLOSE)
    @attrs.frozen
    class SessionClose(WireMessage):
        reason: int = wire("H", allowed=CloseReason)
        in_flight_policy: int = wire("B", allowed=InFlightPolicy)
        _reserved: ClassVar[Reserved] = reserved("B")
        drain_timeout_ms: int = wire("I")
        ...

``message`` reads the declarations back, in class order, and builds the class's
``Layout``:

* the *pack* struct writes reserved fields as pad bytes (always zero), so encoding is one
  ``pack`` call over the named fields;
* the *unpack* struct reads reserved fields as integers, so decoding rejects a non-zero
  one (docs/reference/nnrp-wire.md section 0: "A receiver MUST reject them");
* registries (``allowed=``: an IntEnum, a range or a set) and flag masks (``mask=``) are
  checked on the raw unpacked tuple before any object is built. All of a layout's checks
  are compiled into one boolean expression (as attrs generates ``__init__``), so the hot
  path (one PARTIAL_RESULT per token) pays a few comparisons; only a failing packet takes
  the slow path that names the offending field.

Reserved fields are class-level markers (``ClassVar``), not attributes: a message object
holds only what the sender chooses. Rules that relate several fields live in the class's
``check`` method.
"""

from __future__ import annotations

import enum
import operator
import struct
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

import attrs

from ._constants import ErrorCode, MsgType
from ._errors import RemoteProtocolError

_SIZES = {"B": 1, "b": 1, "H": 2, "h": 2, "I": 4, "i": 4, "Q": 8, "q": 8}
_SPEC = "nnrp.wire"

Allowed = type[enum.IntEnum] | range | frozenset[int]


@attrs.frozen
class FieldSpec:
    """How one metadata field is carried: its struct code and what values it may take."""

    code: str
    allowed: frozenset[int] | range | None = None
    mask: int | None = None  # the bits that may be set; reserved fields have mask 0
    is_reserved: bool = False


@attrs.frozen
class Reserved:
    """A reserved field's place in a layout (declared as a ``ClassVar``)."""

    spec: FieldSpec


def wire(code: str, default: int = 0, *, allowed: Allowed | Iterable[int] | None = None,
         mask: int | None = None) -> Any:
    """A metadata field: struct ``code`` (``B``, ``H``, ``I``, ``Q``, signed ``h``...),
    with an optional registry (``allowed``) or flag mask (``mask``)."""
    if code not in _SIZES:
        raise ValueError(f"unknown struct code {code!r}")
    values: frozenset[int] | range | None
    if allowed is None or isinstance(allowed, range):
        values = allowed
    else:
        values = frozenset(int(v) for v in allowed)  # an IntEnum class iterates its members
    return attrs.field(default=default,
                       metadata={_SPEC: FieldSpec(code, allowed=values, mask=mask)})


def reserved(code: str) -> Reserved:
    """A reserved field: written as zero; a non-zero value on the wire is rejected."""
    return Reserved(FieldSpec(code, mask=0, is_reserved=True))


#: (raw index, inverted mask, field name, reserved?) and (raw index, allowed, field name).
_MaskCheck = tuple[int, int, str, bool]
_SetCheck = tuple[int, frozenset[int] | range, str]


class Layout:
    """Precompiled pack/unpack machinery and field checks for one metadata layout."""

    __slots__ = ("_fields", "_guard", "_masks", "_named_checks", "_pick", "_sets", "get_values",
                 "names", "pack_struct", "size", "unpack_struct", "what")

    def __init__(self, fields: Iterable[tuple[str, FieldSpec]], what: str = "metadata") -> None:
        self._fields = tuple(fields)
        #: How errors name the message ("session_close.reason: value 9 is not defined").
        self.what = what
        pack_fmt, unpack_fmt = ["<"], ["<"]
        names: list[str] = []
        named_index: list[int] = []
        masks: list[_MaskCheck] = []
        sets: list[_SetCheck] = []
        for index, (name, spec) in enumerate(self._fields):
            unpack_fmt.append(spec.code)
            if spec.is_reserved:
                pack_fmt.append(f"{_SIZES[spec.code]}x")
            else:
                pack_fmt.append(spec.code)
                names.append(name)
                named_index.append(index)
            if spec.mask is not None:
                masks.append((index, ~spec.mask, name, spec.is_reserved))
            if spec.allowed is not None:
                sets.append((index, spec.allowed, name))
        self.pack_struct = struct.Struct("".join(pack_fmt))
        self.unpack_struct = struct.Struct("".join(unpack_fmt))
        self.size = self.pack_struct.size
        self.names = tuple(names)
        self._masks = tuple(masks)
        self._sets = tuple(sets)
        self._guard = _compile_guard(self._masks, self._sets)
        # The same checks, indexed into the named values (for ``WireMessage.validate``).
        position = {raw: named for named, raw in enumerate(named_index)}
        self._named_checks = (
            tuple((position[i], inverse, n, r) for i, inverse, n, r in masks if i in position),
            tuple((position[i], allowed, n) for i, allowed, n in sets if i in position))
        pick: Callable[[tuple[int, ...]], Any]
        if len(named_index) == 1:
            only = named_index[0]
            pick = lambda values: (values[only],)  # noqa: E731
        elif named_index:
            pick = operator.itemgetter(*named_index)
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

    @property
    def fields(self) -> tuple[tuple[str, FieldSpec], ...]:
        """Every field in wire order, reserved ones included, with its declaration."""
        return self._fields

    @classmethod
    def of(cls, message_class: type, what: str) -> Layout:
        """The layout of a message class: its ``wire`` fields and ``reserved`` markers,
        in declaration order (base classes first)."""
        declared = {field.name: field.metadata[_SPEC] for field in attrs.fields(message_class)}
        fields: list[tuple[str, FieldSpec]] = []
        for klass in reversed(message_class.__mro__):
            for name in vars(klass).get("__annotations__", {}):
                marker = vars(klass).get(name)
                if isinstance(marker, Reserved):
                    fields.append((name, marker.spec))
                elif name in declared and all(n != name for n, _ in fields):
                    fields.append((name, declared[name]))
        return cls(fields, what)

    def unpack(self, buffer: bytes | bytearray | memoryview, offset: int = 0
               ) -> tuple[int, ...]:
        """Named field values, after checking reserved fields, masks and registries."""
        values = self.unpack_struct.unpack_from(buffer, offset)
        if self._guard(values):
            self._raise(values, self._masks, self._sets)
        picked: tuple[int, ...] = self._pick(values)
        return picked

    def check_named(self, values: tuple[int, ...]) -> None:
        """The same checks on named values (a message built in code, not decoded)."""
        self._raise(values, *self._named_checks)

    def _raise(self, values: tuple[int, ...], masks: tuple[_MaskCheck, ...],
               sets: tuple[_SetCheck, ...]) -> None:
        """The slow path: find the first failing check and name it."""
        what = self.what
        for index, inverse, name, is_reserved in masks:
            if values[index] & inverse:
                if is_reserved:
                    raise RemoteProtocolError(
                        f"{what}: reserved field at byte {self.offset_of(name)} is "
                        f"{values[index]:#x}, must be 0", code=ErrorCode.MALFORMED_BODY)
                raise RemoteProtocolError(
                    f"{what}.{name}: reserved bits {values[index] & inverse:#x} set",
                    code=ErrorCode.MALFORMED_BODY)
        for index, allowed, name in sets:
            if values[index] not in allowed:
                raise RemoteProtocolError(f"{what}.{name}: value {values[index]} is not defined",
                                          code=ErrorCode.MALFORMED_BODY)

    def offset_of(self, name: str) -> int:
        """Byte offset of a field (by name) inside the metadata."""
        offset = 0
        for field_name, spec in self._fields:
            if field_name == name:
                return offset
            offset += _SIZES[spec.code]
        raise KeyError(name)


def _compile_guard(masks: tuple[_MaskCheck, ...], sets: tuple[_SetCheck, ...]
                   ) -> Callable[[tuple[int, ...]], bool]:
    """One expression that is true when any check fails (then ``_raise`` names it)."""
    terms: list[str] = []
    namespace: dict[str, Any] = {}
    for index, inverse, _, is_reserved in masks:
        terms.append(f"v[{index}]" if is_reserved else f"v[{index}] & {inverse}")
    for index, allowed, _ in sets:
        if isinstance(allowed, range) and allowed.step == 1:
            terms.append(f"not {allowed.start} <= v[{index}] < {allowed.stop}")
        else:
            namespace[f"allowed_{index}"] = allowed
            terms.append(f"v[{index}] not in allowed_{index}")
    source = f"def guard(v):\n    return bool({' or '.join(terms) or 'False'})\n"
    exec(compile(source, "<nnrp layout guard>", "exec"), namespace)
    guard: Callable[[tuple[int, ...]], bool] = namespace["guard"]
    return guard


W = TypeVar("W", bound="WireMessage")


class WireMessage:
    """Shared behaviour of every metadata class; never instantiated directly.

    ``LAYOUT.size`` is the exact meta_len; ``unpack`` decodes and checks; ``validate``
    checks a message built in code; ``expected_body_len`` says what body_len must be
    (``None`` when the body is typed regions that a separate parser checks).
    """

    __slots__ = ()
    LAYOUT: ClassVar[Layout]
    MSG_TYPE: ClassVar[MsgType]

    @classmethod
    def unpack(cls: type[W], data: bytes | bytearray | memoryview, offset: int = 0) -> W:
        """Decode and check metadata starting at ``offset``; raise RemoteProtocolError."""
        message = cls(*cls.LAYOUT.unpack(data, offset))
        message.check()
        return message

    def check(self) -> None:
        """Cross-field rules (one field's registry is declared with the field)."""

    def validate(self) -> None:
        """Registries, masks and cross-field rules of a message built in code."""
        self.LAYOUT.check_named(self.LAYOUT.get_values(self))
        self.check()

    def expected_body_len(self) -> int | None:
        """The exact body length this metadata announces (default: no body)."""
        return 0


M = TypeVar("M", bound=type[WireMessage])


def message(msg_type: MsgType) -> Callable[[M], M]:
    """Bind a metadata class to its msg_type and build its layout from its fields."""

    def bind(cls: M) -> M:
        cls.MSG_TYPE = msg_type
        cls.LAYOUT = Layout.of(cls, msg_type.name.lower())
        return cls

    return bind


def check(condition: bool, text: str) -> None:
    """Reject a cross-field rule violation with a MALFORMED_BODY error."""
    if not condition:
        raise RemoteProtocolError(text, code=ErrorCode.MALFORMED_BODY)
