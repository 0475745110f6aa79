"""Command-line options generated from the configuration dataclasses (:mod:`baselines.fields`): one flag per field
of :class:`~baselines.config.TrainConfig` (``mappa train``, and every arm of ``mappa ablate``) and of
:class:`~baselines.evaluation.evaluate.EvalConfig` (``mappa eval``), its help the first sentence of the field's
docstring, its choices the field's ``Literal``. A new option is a new field; nothing here names one.

How a field's type is given:

===========================  ====================================================================================
``bool`` (or ``| None``)     ``--name`` / ``--no-name`` (a field's ``negative``: an old spelling, hidden, that warns)
``Literal[...]``             ``--name VALUE`` among its values
``int``, ``float``, ``str``  ``--name VALUE`` (``X | None``: ``X``; None is not given on the command line)
``tuple[X, ...]``            ``--name VALUE``, repeatable: the values in order, replacing the preset's
``tuple[X, X]``              ``--name VALUE VALUE``
``dict[str, str]``           ``--name KEY=VALUE``, repeatable: merged over the preset's (a key given twice: the last)
``dict[str, Any]``           the same, the values read as JSON (``--env-arg turns=2``)
===========================  ====================================================================================
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from typing import Any

from baselines.fields import base_type, field_types, flag, help_text, literal_choices, negative_flags

from .common import OldSpelling, parse_value


def _field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def _argument(cls: type, f: dataclasses.Field, tp: Any) -> tuple[list[str], dict[str, Any]]:
    """The ``add_argument`` arguments of field ``f`` (type ``tp``); its default is set by :func:`add_options`."""
    name = flag(f)
    kwargs: dict[str, Any] = {"dest": f.name, "help": help_text(cls, f.name).replace("%", "%%"), "default": None}
    metavar = f.metadata.get("metavar") or name.lstrip("-").upper().replace("-", "_")
    tp = base_type(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    values = literal_choices(tp)
    if tp is bool:
        kwargs.update(action=argparse.BooleanOptionalAction)
    elif values is not None:
        kwargs.update(choices=values, type=type(values[0]))
    elif origin is dict and args[0] is str:
        kwargs.update(action="append", metavar=f.metadata.get("metavar", "KEY=VALUE"))
        kwargs["help"] += " (repeatable)"
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        kwargs.update(action="append", type=args[0], metavar=metavar)
        kwargs["help"] += " (repeatable)"
    elif origin is tuple and args and len(set(args)) == 1:
        kwargs.update(nargs=len(args), type=args[0], metavar=metavar)
    elif tp in (int, float, str):
        kwargs.update(type=tp, metavar=metavar)
    else:
        raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for a {tp!r} (baselines.fields)")
    return [name], kwargs


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    exclude: tuple[str, ...] = (),
    defaults: str = "preset",
) -> None:
    """A flag for every field of the dataclass ``cls`` but those in ``exclude``, whose value lands in ``args.<field>``.
    ``defaults="preset"``: a flag not given is None (the preset's value stays: :func:`given` leaves it out);
    ``"field"``: the field's default, shown in the help (a repeatable flag's is None all the same)."""
    types = field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        flags, kwargs = _argument(cls, f, types[f.name])
        action = parser.add_argument(*flags, **kwargs)
        for old in negative_flags(f)[1:] if kwargs.get("action") is argparse.BooleanOptionalAction else ():
            parser.add_argument(
                old, dest=f.name, action=OldSpelling, value=False, new=negative_flags(f)[0], help=argparse.SUPPRESS
            )
        if defaults == "field" and kwargs.get("action") != "append":
            action.default = _field_default(f)
            if action.default is not None:
                action.help = f"{action.help} (default: %(default)s)"


def _pairs(items: list[str], f: dataclasses.Field, as_json: bool, prog: str) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not (as_json or value.strip()):
            raise SystemExit(f"{prog}: {flag(f)} takes {f.metadata.get('metavar', 'KEY=VALUE')}, not {item!r}")
        out[key.strip()] = parse_value(value) if as_json else value.strip()
    return out


def given(
    args: argparse.Namespace, cls: type, *, exclude: tuple[str, ...] = (), base: Any = None, prog: str = "mappa"
) -> dict[str, Any]:
    """The fields of ``cls`` the parsed ``args`` give (a flag not given, None, is left out), as field values: a
    repeatable flag's list as a tuple, or as a mapping merged over ``base``'s (a configuration, or None)."""
    types = field_types(cls)
    out = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f.name, None)
        if f.name in exclude or value is None:
            continue
        tp = base_type(types[f.name])
        origin = typing.get_origin(tp)
        if origin is dict:
            pairs = _pairs(value, f, typing.get_args(tp)[1] is not str, prog)
            value = {**(getattr(base, f.name) if base is not None else {}), **pairs}
        elif origin is tuple:
            value = tuple(value)
        out[f.name] = value
    return out


def _text(value: Any, as_json: bool) -> str:
    """A value as its flag takes it (JSON where the flag reads JSON and the plain text would read otherwise)."""
    if not as_json:
        return str(value)
    return value if isinstance(value, str) and parse_value(value) == value else json.dumps(value)


def as_argv(cls: type, values: dict[str, Any]) -> list[str]:
    """The flags that give each field of ``values`` its value: the inverse of :func:`given` (``mappa ablate`` passes
    its training options on to every arm's ``mappa train`` with it)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types = field_types(cls)
    argv: list[str] = []
    for name, value in values.items():
        f, tp = fields[name], base_type(types[name])
        origin = typing.get_origin(tp)
        if tp is bool:
            argv.append(flag(f) if value else negative_flags(f)[0])
        elif origin is dict:
            as_json = typing.get_args(tp)[1] is not str
            for k, v in value.items():
                argv += [flag(f), f"{k}={_text(v, as_json)}"]
        elif origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,):
            for v in value:
                argv += [flag(f), str(v)]
        elif origin is tuple:
            argv += [flag(f), *(str(v) for v in value)]
        else:
            argv += [flag(f), str(value)]
    return argv


__all__ = ["add_options", "as_argv", "given"]
