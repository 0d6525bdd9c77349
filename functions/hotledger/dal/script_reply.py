"""A Lua script's reply as a typed value: each reply class states its shape, one parser reads them all.

A script answers an array [status, value, ...] whose values depend on the status (each script's header in
layers/lua/ states them). A reply class is a frozen dataclass deriving ScriptReply: its first field `status` is an
Enum of the status texts, and FIELDS names, per status, the fields its values fill, in order."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, ClassVar, Self

from hotledger.dal.redis_store import reply_fields

Fields = tuple[str | None, ...]
"""The fields a status's values fill, in order; None for a value the class does not keep."""


class ScriptReply:
    """Base of a script reply class. `parse` converts each value by its field's type: int, str (or either | None),
    the status Enum, or tuple[int, ...], which takes every value left (only last). A field whose text means
    something else names its converter in CONVERT. A status FIELDS does not name carries no value; a reply shorter
    than its fields leaves the rest at their defaults, and values past them are not read."""

    FIELDS: ClassVar[Mapping[Any, Fields]] = {}
    CONVERT: ClassVar[Mapping[str, Callable[[str], Any]]] = {}

    @classmethod
    def parse(cls, raw: Sequence[bytes | str | int], fields: Mapping[Any, Fields] | None = None) -> Self:
        """`fields`: another script's shape for the same class (default FIELDS)."""
        head, *rest = reply_fields(raw)
        status, steps = _plan(cls, cls.FIELDS if fields is None else fields, head)
        values: dict[str, Any] = {}
        for i, name, convert, takes_rest in steps:
            if i < len(rest):
                values[name] = tuple(convert(v) for v in rest[i:]) if takes_rest else convert(rest[i])
        make: Callable[..., Self] = cls
        return make(status, **values)


# what a status's values fill: (position, field, its converter, whether it takes every value left)
Steps = tuple[tuple[int, str, Callable[[str], Any], bool], ...]
# (class, id of its shape) -> (the shape, kept so its id is not reused; status text -> (status, steps))
_PLANS: dict[tuple[type[ScriptReply], int], tuple[Mapping[Any, Fields], dict[str, tuple[Any, Steps]]]] = {}


def _plan(cls: type[ScriptReply], shape: Mapping[Any, Fields], head: str) -> tuple[Any, Steps]:
    """The status a reply's head names and how its values are read, worked out once per class, shape and status
    (every reply of the hot path is parsed so)."""
    kept = _PLANS.get((cls, id(shape)))
    if kept is None or kept[0] is not shape:
        kept = _PLANS[cls, id(shape)] = (shape, {})
    plans = kept[1]
    if head not in plans:
        status = _converter(cls, "status")[0](head)
        plans[head] = (
            status,
            tuple(
                (i, name, *_converter(cls, name)) for i, name in enumerate(shape.get(status, ())) if name is not None
            ),
        )
    return plans[head]


_CONVERTERS: dict[tuple[type[ScriptReply], str], tuple[Callable[[str], Any], bool]] = {}


def _converter(cls: type[ScriptReply], name: str) -> tuple[Callable[[str], Any], bool]:
    """How the field `name` reads its text, and whether it takes every value left (tuple[int, ...])."""
    if (cls, name) not in _CONVERTERS:
        _CONVERTERS[cls, name] = _read_converter(cls, name)
    return _CONVERTERS[cls, name]


def _read_converter(cls: type[ScriptReply], name: str) -> tuple[Callable[[str], Any], bool]:
    if name in cls.CONVERT:
        return cls.CONVERT[name], False
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType) and type(None) in hint.__args__:  # int | None: read as int
        (hint,) = (arg for arg in hint.__args__ if arg is not type(None))
    takes_rest = typing.get_origin(hint) is tuple and typing.get_args(hint)[1:] == (Ellipsis,)
    if takes_rest:
        hint = typing.get_args(hint)[0]
    if not (isinstance(hint, type) and (hint in (int, str) or issubclass(hint, Enum))):
        raise TypeError(f"{cls.__name__}.{name}: a reply value reads as int, str or an Enum, not {hint}")
    return hint, takes_rest
