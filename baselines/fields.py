"""Configuration fields that carry their own command-line form, so that an option is declared once: as a field of a
configuration dataclass (:class:`~baselines.config.TrainConfig`, :class:`~baselines.evaluation.evaluate.EvalConfig`).

A field's type says how it is given (``bool``: a ``--name`` / ``--no-name`` switch; a ``Literal``: its choices; a
``tuple[str, ...]``: a repeatable flag; a ``dict``: repeatable ``KEY=VALUE``), its attribute docstring says what it
does (the first sentence is the flag's help), and :func:`option` adds what neither can say: a flag spelled other than
``--field-name``, a metavar, whether a resumed run may change it. ``mappa``'s parsers are generated from this
(:mod:`benchmarks.commands.options`); the pre-flight checks read their choice lists from the ``Literal`` types
(:func:`choices`), the resume rule its fields (:func:`resume_may_change`)."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import itertools
import json
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Literal

# PyYAML is imported where a YAML config is read: it is optional (the train extra).

_MISSING: Any = dataclasses.MISSING


def option(
    default: Any = _MISSING,
    *,
    default_factory: Any = _MISSING,
    flag: str | None = None,
    negative: str | None = None,
    metavar: str | tuple[str, ...] | None = None,
    help: str | None = None,
    resume_may_change: bool = False,
) -> Any:
    """A dataclass field with its command-line metadata: ``flag`` (default ``--field-name``, ``-k`` for a one-letter
    field), ``negative`` (a switch's extra flag that sets it False, besides ``--no-name``), ``metavar``, ``help``
    (default: the field docstring's first sentence) and ``resume_may_change`` (a resumed run may give it another
    value: :func:`baselines.runs.store.check_resumable`). Ruff's RUF009 does not know it for a field specifier: a field
    of a mutable type (a ``dict``) says ``# noqa: RUF009``."""
    given = {"flag": flag, "negative": negative, "metavar": metavar, "help": help}
    metadata: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if resume_may_change:
        metadata["resume_may_change"] = True
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def flag(f: dataclasses.Field) -> str:
    """The flag that sets field ``f``."""
    return f.metadata.get("flag") or ("-" + f.name if len(f.name) == 1 else "--" + f.name.replace("_", "-"))


def negative_flags(f: dataclasses.Field) -> tuple[str, ...]:
    """The flags that set a ``bool`` field False: ``--no-name`` (and the field's ``negative``, if any)."""
    return ("--no-" + flag(f).lstrip("-"), *([f.metadata["negative"]] if "negative" in f.metadata else []))


def field_types(cls: type) -> dict[str, Any]:
    """Each field's type, resolved (``from __future__ import annotations`` leaves them as strings)."""
    return typing.get_type_hints(cls)


def base_type(tp: Any) -> Any:
    """``X`` of ``X | None``; any other type itself."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal`` type (or of ``Literal[...] | None``), else None."""
    tp = base_type(tp)
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def choices(cls: type, name: str) -> tuple[Any, ...]:
    """The values field ``name`` of ``cls`` may take, from its ``Literal`` type."""
    found = literal_choices(field_types(cls)[name])
    if found is None:
        raise TypeError(f"{cls.__name__}.{name} is not a Literal")
    return found


def one_of(values: tuple[Any, ...]) -> str:
    """``'a', 'b' or 'c'``."""
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def choice_problems(cfg: Any) -> list[str]:
    """A line for each field of the dataclass instance ``cfg`` whose value is not one of its ``Literal``'s."""
    problems = []
    for name, tp in field_types(type(cfg)).items():
        allowed, value = literal_choices(tp), getattr(cfg, name)
        if allowed is not None and value not in allowed and not (value is None and base_type(tp) is not tp):
            problems.append(f"{name} must be {one_of(allowed)}, not {value!r}")
    return problems


def _coerce(name: str, tp: Any, value: Any) -> Any:
    """``value`` (as JSON or YAML gives it) as field ``name`` of type ``tp`` holds it: a list as a tuple; a number
    where a float is asked; anything else of the wrong type an error naming the field."""
    tp = base_type(tp)
    origin = typing.get_origin(tp)
    if value is None:
        return None
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{name} takes a list, not {value!r}")
        return tuple(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{name} takes a mapping, not {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (bool, int, float, str) and not (isinstance(value, tp) and (tp is bool or not isinstance(value, bool))):
        raise ValueError(f"{name} takes a {tp.__name__}, not {value!r}")
    return value


def values_from_mapping(cls: type, data: dict[str, Any], *, ignore: tuple[str, ...] = (), what: str = "") -> dict:
    """The field values of ``cls`` that the mapping ``data`` gives (a configuration file's contents), each as the
    field holds it; keys in ``ignore`` skipped (what a run's ``config.json`` records beside its fields). A key that is
    no field is an error naming it and the fields, not a silent default."""
    types_ = field_types(cls)
    unknown = sorted(k for k in data if k not in types_ and k not in ignore)
    if unknown:
        near = {k: difflib.get_close_matches(k, list(types_), n=1) for k in unknown}
        hint = "; ".join(f"{k!r}: did you mean {m[0]!r}?" for k, m in near.items() if m)
        raise ValueError(
            f"{what or cls.__name__}: unknown keys {unknown}"
            + (f" ({hint})" if hint else "")
            + f"; the fields are {sorted(types_)}"
        )
    return {k: _coerce(k, types_[k], v) for k, v in data.items() if k in types_}


def read_mapping(path: str) -> dict[str, Any]:
    """A configuration file's mapping: JSON (``.json``) or YAML (``.yaml``, ``.yml``; needs PyYAML). A file that
    is not a mapping, or does not parse, is an error naming it."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the configuration file ({e.strerror or e})") from None
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml  # PyYAML: the train extra

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:
        raise ValueError(
            f"{path}: not a valid {'YAML' if p.suffix.lower() in ('.yaml', '.yml') else 'JSON'} file: {e}"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a configuration file holds a mapping of field names to values")
    return data


def resume_may_change(cls: type) -> frozenset[str]:
    """The fields of ``cls`` marked ``option(..., resume_may_change=True)``."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("resume_may_change"))


@functools.cache
def _class_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of ``cls``'s own body (a string right after ``name: type = ...``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a frozen build): no help beyond the metadata
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstring of every documented field of ``cls``, its base classes' included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_class_docs(klass))
    return docs


_ROLE = re.compile(r":(?:mod|func|class|data|meth|attr):`~?([^`]+)`")
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)\.(?=\s+[A-Z('\"]|\s*$)")


def plain(text: str) -> str:
    """A docstring's text without its reST markup, on one line."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1), text)
    return " ".join(text.replace("``", "").split())


def help_text(cls: type, name: str) -> str:
    """Field ``name``'s help: its ``help`` metadata, else the first sentence of its docstring ("" if neither)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    if "help" in f.metadata:
        return f.metadata["help"]
    doc = plain(field_docs(cls).get(name, ""))
    end = _SENTENCE_END.search(doc)
    return doc[: end.start()] if end else doc


__all__ = [
    "base_type",
    "choice_problems",
    "choices",
    "field_docs",
    "field_types",
    "flag",
    "help_text",
    "literal_choices",
    "negative_flags",
    "one_of",
    "option",
    "resume_may_change",
]
