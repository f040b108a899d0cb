"""Messages declared once: each message dataclass declares its fields (`wire(kind, default, ...)`)
and `@message` generates its `to_control` / `from_control` from that declaration, as Kafka
generates its `*Data` classes from JSON specs.

A field's declaration says how it travels and what a peer may send in it:

- `kind`: the value's wire type (`INT`, `STR`, `Seq(int)`, `Entries(SomeEntry)`, ...), which
  encodes it and decodes it with the checks of `protocol.fields` (InvalidRequestError naming
  the field for a wrong type or a missing required field);
- `default`: the dataclass default, also what an absent or null value decodes to (`absent`
  overrides that when the two differ); no default and no `absent`: the field is required;
- `key`: the control map's key when it is not the field's name;
- `check`: a `Check` the decoded value must pass (non-negative, one of, a bound), raising its
  named error;
- `entry=True`: a fault in this field belongs to the entry alone (Kafka answers per partition):
  it is kept on the entry's `error` field instead of raised (the first faulty field's, in wire
  order), the field taking `placeholder` when its value is unusable (missing or mistyped) and
  keeping a well-typed value that fails its check;
- `omit`: a value sent as absence (an optional field, e.g. added in a later version): senders
  that never set it send the bytes they always did;
- `payload=True`: the value travels in the payload, not the control map, which carries only its
  size under `key` (`PayloadSize`); the entry's `from_control(control, name=value)` takes the
  value from the message's `PayloadTopics`, whose hand-written parser splits the payload.

The control map's key order is part of the wire format (msgpack keeps it): fields travel in
declaration order, or in the class's `wire_order` (field names) when that differs; an
`errors_last` class sends its `error_code` / `error_message` after the others. A response with no
`error_code` key of its own starts with the whole-request `error_code` 0 (`base`).

The code is generated once per class, when the class is created (as `dataclasses` generates
`__init__`): the produce and fetch paths decode many entries per request, so a well-typed scalar
costs one class comparison and nothing walks the declaration per call. `MESSAGE_TYPES` lists every
declared class, so the round-trip tests cover a new message without a test of its own.
"""
from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

from common.errors import NONE, InvalidRequestError, PymqError
from protocol.fields import REQUIRED, entries, field
from protocol.framing import ApiKey

_MISSING: Any = dataclasses.MISSING
_ABSENT: Any = object()  # an `absent` not given: the dataclass default


class Check:
    """A rule a decoded value must follow, raising `error(message)` otherwise; `message` is
    formatted with the field's `name` and the `value`. `values`, when given, are all the valid
    ones (a one-of), so the tests' strategies draw from them."""

    __slots__ = ("accepts", "message", "error", "values")

    def __init__(self, accepts: Callable[[Any], bool], message: str, error: type[PymqError] = InvalidRequestError,
                 values: tuple[Any, ...] | None = None) -> None:
        self.accepts, self.message, self.error, self.values = accepts, message, error, values

    def failure(self, name: str, value: Any) -> PymqError | None:
        """The error for `value` in field `name`, or None when it passes (None values pass: an
        absent optional field)."""
        if value is None or self.accepts(value):
            return None
        return self.error(self.message.format(name=name, value=value))


def one_of(values: tuple[Any, ...], message: str, error: type[PymqError] = InvalidRequestError) -> Check:
    return Check(values.__contains__, message, error, values)


NON_NEGATIVE = Check(lambda v: v >= 0, "field {name!r} must be >= 0, got {value}")


class Kind:
    """How a field's value travels: `encode_expr` is the Python expression that encodes the
    value `v` (names it needs go into `names`), `decode` reads it from a control map (absent ->
    `absent`, `REQUIRED` when required). `fast` is the class a well-typed value has, checked
    inline before calling `decode` at all; None for kinds that always decode. A kind that
    `uses_payload` decodes with `decode_payload(control, key, cursor)` instead, and one only a
    `payload=True` field uses (its value comes with the payload) has no `decode`: a field of a
    kind without it is refused when its class is created."""

    fast: type | None = None
    uses_payload = False

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return v


class Scalar(Kind):
    """An int, str, bool or bytes (or one of a tuple of types), sent as is."""

    def __init__(self, kind: type | tuple[type, ...]) -> None:
        self.kind = kind
        self.fast = kind if isinstance(kind, type) else None

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        return field(control, key, self.kind, absent)


INT, STR, BOOL, BYTES = Scalar(int), Scalar(str), Scalar(bool), Scalar(bytes)


class Seq(Kind):
    """A list of scalars of `item` type, held as a tuple; `message` (formatted with `name` and
    the offending item's `type`) is the error for an item of another type, `not_a_list` (when
    given) that for a value that is no list."""

    def __init__(self, item: type, message: str = "field {name!r} must be a list of {what}, got a {type}",
                 not_a_list: str | None = None) -> None:
        self.item, self.message, self.not_a_list = item, message, not_a_list

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"(None if {v} is None else list({v}))"

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        try:
            values = field(control, key, list, absent)
        except InvalidRequestError:
            if self.not_a_list is None:
                raise
            raise InvalidRequestError(self.not_a_list) from None
        if values is None or values is absent:
            return values
        item = self.item
        for value in values:
            if value.__class__ is not item:
                what = "ints" if item is int else "strings"
                raise InvalidRequestError(self.message.format(name=key, what=what, type=type(value).__name__))
        return tuple(values)


class Entries(Kind):
    """A list of maps, each a declared entry type's (`cls.from_control`), held as a tuple."""

    def __init__(self, entry_type: type) -> None:
        self.entry_type = entry_type

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"[e.to_control() for e in {v}]"

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        if absent is not REQUIRED and control.get(key) is None:
            return absent
        parse = self.entry_type.from_control
        return tuple([parse(item) for item in entries(control, key)])


class Topics(Kind):
    """A request's or response's `topics` addressed per topic and partition (`TopicRequest` or
    `TopicResponse` entries, whose partitions are `partition_type`s)."""

    def __init__(self, topic_type: type, partition_type: type) -> None:
        self.topic_type, self.partition_type = topic_type, partition_type

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"[t.to_control() for t in {v}]"

    def decode(self, control: dict[str, Any], key: str, absent: Any) -> Any:
        if absent is not REQUIRED and control.get(key) is None:
            return absent
        topic_type, parse = self.topic_type, self.partition_type.from_control
        return tuple([topic_type.from_control(t, parse) for t in entries(control, key)])


@dataclasses.dataclass(frozen=True, slots=True)
class Wire:
    """One field's declaration (see the module docstring)."""

    kind: Kind
    key: str | None
    absent: Any
    check: Check | None
    entry: bool
    placeholder: Any
    omit: Any
    payload: bool


def wire(kind: Kind, default: Any = _MISSING, *, key: str | None = None, absent: Any = _ABSENT,
         check: Check | None = None, entry: bool = False, placeholder: Any = _ABSENT, omit: Any = _ABSENT,
         payload: bool = False, default_factory: Any = _MISSING) -> Any:
    """Declare a message field (a `dataclasses.field` carrying its `Wire`)."""
    if absent is _ABSENT:
        absent = default_factory() if default_factory is not _MISSING else default
    if absent is _MISSING:
        absent = REQUIRED
    spec = Wire(kind, key, absent, check, entry, absent if placeholder is _ABSENT else placeholder, omit, payload)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={"wire": spec})


def error_code_field(prefix: str = "") -> Any:
    """The `error_code` of an outcome (0: none), sent as `<prefix>error_code`."""
    return wire(INT, NONE, key=prefix + "error_code")


def error_message_field(prefix: str = "") -> Any:
    """The `error_message` of an outcome, sent as `<prefix>error_message` when there is one."""
    return wire(STR, None, key=prefix + "error_message", omit=None)


MESSAGE_TYPES: list[type] = []


def message(cls: type) -> type:
    """Make `cls` a frozen slotted dataclass whose `to_control` and `from_control` are generated
    from its declared fields, and list it in MESSAGE_TYPES. (`payload()` and the splitting of a
    received payload stay hand-written where a message has one.)"""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    _generate(cls)
    abc.update_abstractmethods(cls)  # `Message`'s abstract codec is now implemented
    MESSAGE_TYPES.append(cls)
    return cls


def declared(cls: type) -> list[tuple[dataclasses.Field[Any], Wire]]:
    """The declared fields of `cls` (those carrying a `Wire`), in wire order."""
    specs = {f.name: (f, f.metadata["wire"]) for f in dataclasses.fields(cls) if "wire" in f.metadata}
    order = getattr(cls, "wire_order", None) or tuple(specs)
    if getattr(cls, "errors_last", False):
        order = [n for n in order if n not in ("error_code", "error_message")] + \
                [n for n in order if n in ("error_code", "error_message")]
    if sorted(order) != sorted(specs):
        raise TypeError(f"{cls.__name__}.wire_order must name every declared field once")
    return [specs[name] for name in order]


def _generate(cls: type) -> None:
    fields = declared(cls)
    names: dict[str, Any] = {"_NOTHING": object(), "NONE": NONE}
    keys = [spec.key or f.name for f, spec in fields]
    is_message = isinstance(getattr(cls, "api_key", None), ApiKey)  # a Message, not an entry of one
    prefix = ""
    if is_message and not getattr(cls, "response_type", None) and "error_code" not in keys:
        prefix = "'error_code': NONE, "  # a response: the whole request succeeded
    cls.to_control = _function(_encoder_source(fields, keys, prefix, names), names, "to_control")
    decoder = _function(_decoder_source(cls, fields, keys, is_message, names), names, "from_control")
    cls.from_control = classmethod(decoder)


def _function(source: str, names: dict[str, Any], name: str) -> Any:
    exec(source, names)  # noqa: S102 - the source is built from the class's declaration only
    return names[name]


def _encoder_source(fields: list[tuple[dataclasses.Field[Any], Wire]], keys: list[str], prefix: str,
                    names: dict[str, Any]) -> str:
    literal, statements = [], []
    for i, ((f, spec), key) in enumerate(zip(fields, keys)):
        expr = spec.kind.encode_expr(f"self.{f.name}", names)
        if spec.payload:
            names[f"_size{i}"] = spec.kind.size  # type: ignore[attr-defined]
            expr = f"_size{i}(self.{f.name})"
        if spec.omit is _ABSENT and not statements:
            literal.append(f"{key!r}: {expr}")
        elif spec.omit is _ABSENT:
            statements.append(f"    out[{key!r}] = {expr}")
        else:
            names[f"_omit{i}"] = spec.omit
            test = f"self.{f.name} is not None" if spec.omit is None else f"self.{f.name} != _omit{i}"
            statements.append(f"    if {test}:\n        out[{key!r}] = {expr}")
    return "\n".join([f"def to_control(self):\n    out = {{{prefix}{', '.join(literal)}}}", *statements,
                      "    return out\n"])


def _decoder_source(cls: type, fields: list[tuple[dataclasses.Field[Any], Wire]], keys: list[str],
                    is_message: bool, names: dict[str, Any]) -> str:
    signature = "cls, control, payload=None" if is_message else "cls, control, **given"
    lines = [f"def from_control({signature}):"]
    errors, uses_payload = [], False
    for i, ((f, spec), key) in enumerate(zip(fields, keys)):
        v = f"v_{f.name}"
        if spec.payload:
            names[f"_default{i}"] = f.default
            lines.append(f"    {v} = given.get({f.name!r}, _default{i})")
            continue
        if spec.kind.uses_payload:
            names[f"_decode{i}"], names[f"_key{i}"] = spec.kind.decode_payload, key  # type: ignore[attr-defined]
            lines.append(f"    {v} = _decode{i}(control, _key{i}, cursor)")
            uses_payload = True
            continue
        names[f"_decode{i}"] = _field_decoder(spec, key)
        fast = spec.kind.fast
        if spec.entry:
            errors.append(f"e{i}")
            names[f"_entry{i}"] = _entry_decoder(spec, key)
            lines.append(f"    {v} = control.get({key!r}, _NOTHING)")
            test = f"{v}.__class__ is _fast{i}" if fast is not None else "False"
            if spec.check is not None and fast is not None:
                names[f"_accepts{i}"] = spec.check.accepts
                test += f" and _accepts{i}({v})"
            names[f"_fast{i}"] = fast
            lines.append(f"    if {test}:\n        e{i} = None\n    else:\n        {v}, e{i} = _entry{i}(control)")
        elif fast is not None and spec.check is None:
            names[f"_fast{i}"] = fast
            lines.append(f"    {v} = control.get({key!r}, _NOTHING)\n"
                         f"    if {v}.__class__ is not _fast{i}:\n        {v} = _decode{i}(control)")
        else:
            lines.append(f"    {v} = _decode{i}(control)")
    if uses_payload:
        names["PayloadCursor"] = PayloadCursor
        lines.insert(1, "    cursor = PayloadCursor(payload)")
        lines.append("    cursor.check_all_claimed()")
    args = []
    for f in dataclasses.fields(cls):
        if "wire" in f.metadata:
            args.append(f"v_{f.name}")
        elif f.name == "error" and errors:
            args.append(" or ".join(errors))
        elif f.name == "error":
            args.append("None")
        else:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with wire()")
    lines.append(f"    return cls({', '.join(args)})\n")
    return "\n".join(lines)


def _reader(spec: Wire, key: str) -> Callable[[dict[str, Any], str, Any], Any]:
    """The kind's `decode`; TypeError (at class creation) for a kind that has none, whose values
    come with the payload."""
    read = getattr(spec.kind, "decode", None)
    if read is None:
        raise TypeError(f"field {key!r}: a {type(spec.kind).__name__} is not read from a control field; "
                        "declare the field payload=True")
    return read


def _field_decoder(spec: Wire, key: str) -> Callable[[dict[str, Any]], Any]:
    """Decode one field of a control map, raising its errors (the type's, then the check's)."""
    read, absent, check = _reader(spec, key), spec.absent, spec.check

    def decode(control: dict[str, Any]) -> Any:
        value = read(control, key, absent)
        if check is not None:
            error = check.failure(key, value)
            if error is not None:
                raise error
        return value

    return decode


def _entry_decoder(spec: Wire, key: str) -> Callable[[dict[str, Any]], tuple[Any, PymqError | None]]:
    """(value, error) of an entry's field: an unusable value is the `placeholder` with its error;
    a well-typed value that fails the check is kept, with the check's error."""
    read, absent, check, placeholder = _reader(spec, key), spec.absent, spec.check, spec.placeholder

    def decode(control: dict[str, Any]) -> tuple[Any, PymqError | None]:
        try:
            value = read(control, key, absent)
        except PymqError as err:
            return placeholder, err
        return value, None if check is None else check.failure(key, value)

    return decode


class PayloadCursor:
    """Splits a received payload among the partition entries that claim it, in their order: each
    takes its `size` bytes as a view (no copy), and together they must claim all of it."""

    __slots__ = ("payload", "pos")

    def __init__(self, payload: memoryview) -> None:
        self.payload, self.pos = payload, 0

    def take(self, size: int) -> memoryview:
        """The next `size` bytes (size >= 0, checked by the caller); InvalidRequestError when the
        payload has fewer left."""
        pos, end = self.pos, len(self.payload)
        if pos + size > end:
            raise InvalidRequestError(f"partition sizes claim more than the payload's {end} bytes")
        self.pos = pos + size
        return self.payload[pos:pos + size]

    def check_all_claimed(self) -> None:
        """InvalidRequestError when bytes are left that no partition claimed."""
        if self.pos != len(self.payload):
            raise InvalidRequestError(f"payload has {len(self.payload) - self.pos} bytes not claimed by any partition")


class PayloadTopics(Kind):
    """`topics` whose `partition_type` entries carry payload bytes: `parse(cursor)` decodes an
    entry with its slice of the payload (special per API, so hand-written); together they must
    claim all of it."""

    uses_payload = True

    def __init__(self, topic_type: type, partition_type: type,
                 parse: Callable[[PayloadCursor], Callable[[dict[str, Any]], Any]]) -> None:
        self.topic_type, self.partition_type, self.parse = topic_type, partition_type, parse

    def encode_expr(self, v: str, names: dict[str, Any]) -> str:
        return f"[t.to_control() for t in {v}]"

    def decode_payload(self, control: dict[str, Any], key: str, cursor: PayloadCursor) -> Any:
        topic_type, parse = self.topic_type, self.parse(cursor)
        return tuple([topic_type.from_control(t, parse) for t in entries(control, key)])


class PayloadSize(Kind):
    """A payload field's control entry: its size in bytes (`size`, a function of the value)."""

    def __init__(self, size: Callable[[Any], int]) -> None:
        self.size = size

