"""argparse options made from a dataclass's fields, so that each default is declared once, on the field.

A field becomes ``--field-name`` (underscores as dashes), with the field's default and type; :func:`option`
gives it help, choices and a metavar as field metadata::

    @dataclass(frozen=True, kw_only=True)
    class Config:
        output_dir: Path = field(metadata=option("where the results go"))
        epochs: int = field(default=10, metadata=option("epochs to train (default %(default)s)"))
        resume: bool = False

    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, Config)
    config = dataclass_from_args(Config, parser.parse_args())

A field without a default is a required option; a ``bool`` field is a switch (``--resume``; a field that
defaults to True gets ``--no-x`` too); ``X | None`` parses as X; help may say ``%(default)s``. Types other
than ``bool`` are called on the option's text (``int``, ``float``, ``Path``, ``str`` and the like).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")

METADATA_KEY = "ddp_cluster.runtime.cliargs"


@dataclasses.dataclass(frozen=True)
class Option:
    """How a field appears on the command line (see :func:`option`)."""

    help: str | None = None
    choices: Sequence[Any] | None = None
    metavar: str | None = None


def option(
    help: str | None = None, *, choices: Sequence[Any] | None = None, metavar: str | None = None
) -> dict[str, Option]:
    """Field metadata for :func:`add_dataclass_arguments`: ``field(default=..., metadata=option("..."))``."""
    return {METADATA_KEY: Option(help=help, choices=choices, metavar=metavar)}


def flag_name(field_name: str) -> str:
    """``--batch-size`` for ``batch_size``."""
    return "--" + field_name.replace("_", "-")


def _value_type(annotation: Any) -> Any:
    """X for ``X | None`` (and ``Optional[X]``), else the annotation itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type[DataclassInstance],
    *,
    defaults: Mapping[str, Any] | None = None,
    exclude: Collection[str] = (),
) -> None:
    """One option per init field of ``cls``, in field order (``exclude`` names fields to leave out).

    ``defaults`` overrides a field's default on the command line only, by field name: ``{"device": None}``
    lets the caller see that the option was not given and fill it in (from the environment, say).
    """
    overrides = dict(defaults or {})
    unknown = set(overrides) - {field.name for field in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.init or field.name in exclude:
            continue
        spec = field.metadata.get(METADATA_KEY, Option())
        kwargs: dict[str, Any] = {"dest": field.name}
        if spec.help is not None:
            kwargs["help"] = spec.help
        if field.name in overrides:
            kwargs["default"] = overrides[field.name]
        elif field.default is not dataclasses.MISSING:
            kwargs["default"] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            kwargs["default"] = field.default_factory()
        else:
            kwargs["required"] = True
        value_type = _value_type(hints[field.name])
        if value_type is bool:
            if kwargs.get("required"):
                raise ValueError(f"{cls.__name__}.{field.name}: a switch needs a default")
            kwargs["action"] = argparse.BooleanOptionalAction if kwargs["default"] else "store_true"
        else:
            if typing.get_origin(value_type) is not None:
                raise ValueError(f"{cls.__name__}.{field.name}: no option for a {value_type} (exclude it)")
            if value_type is not str:
                kwargs["type"] = value_type
            if spec.choices is not None:
                kwargs["choices"] = spec.choices
            if spec.metavar is not None:
                kwargs["metavar"] = spec.metavar
        parser.add_argument(flag_name(field.name), **kwargs)


def dataclass_from_args(cls: type[D], namespace: argparse.Namespace, **changes: Any) -> D:
    """``cls`` from the parsed options of its init fields (other attributes of ``namespace`` are ignored),
    with ``changes`` (field name: value) applied over them."""
    values = {
        field.name: getattr(namespace, field.name)
        for field in dataclasses.fields(cls)
        if field.init and hasattr(namespace, field.name)
    }
    return cls(**(values | changes))
