"""The Python API's keyword arguments as the CLI's flags: the same names (`secrets` is `--secret`),
checked by the same converters (`cli.options.OPTIONS`: ranges, one-line errors) and the same refusal
of a setting the chosen cloud would ignore (`cli.args.refuse_flags`), so `gpucluster.run(nodes=0)`
raises the UsageError `gpucluster run --nodes 0` prints."""

from __future__ import annotations

from typing import Iterable, Mapping, NoReturn

import click

from gpucluster.errors import UsageError, did_you_mean
from gpucluster.states import JsonObject

# the API's spelling -> the flag's parameter name, where they differ
SPELLED = {"secrets": "secret", "env_files": "env_file"}
# what the API fills in itself (never a keyword)
INTERNAL = ("provisioning", "readers", "job", "default_workload", "dry_run")


def _typed(kind: click.ParamType, value: object) -> object:
    """`value` through the flag's converter, as the CLI hands it over (numbers as their text, so the
    error quotes them the same way)."""
    given = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    return kind.convert(given, None, None)


def _listed(name: str, value: object) -> tuple[str, ...]:
    """A repeatable flag's value: a string (one), a mapping (KEY=VALUE each) or a sequence."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)):
        return (value.decode() if isinstance(value, bytes) else value,)
    if isinstance(value, Mapping):
        return tuple(f"{k}={v}" for k, v in value.items())
    if isinstance(value, Iterable):
        return tuple(str(v) for v in value)
    raise UsageError(f"{name}={value!r} is not allowed: a string, a list of strings or a mapping")


def flags_of(given: Mapping[str, object], allowed: Iterable[str], *,
             defaults: Mapping[str, object]) -> tuple[JsonObject, dict[str, tuple[tuple[str, ...], object]]]:
    """(the flags of a command, each checked as its flag is; name -> (flags, value) of those given),
    from the keywords `given`; an unknown keyword is a UsageError naming the close one."""
    from gpucluster.cli.options import OPTIONS

    allowed = tuple(allowed)
    out: JsonObject = dict(defaults)
    shown: dict[str, tuple[tuple[str, ...], object]] = {}
    for key, value in given.items():
        name = SPELLED.get(key, key)
        if name not in allowed or name in INTERNAL:
            _unknown(key, allowed)
        if value is None:
            continue
        opts, kw = OPTIONS.get(name, ((f"--{name.replace('_', '-')}",), {}))
        value = _checked(key, name, value, kw)
        out[name] = value
        shown[name] = (tuple(o for o in opts if o.startswith("-")), value)
    return out, shown


def _unknown(key: str, allowed: tuple[str, ...]) -> NoReturn:
    """UsageError: `key` is no keyword of this command; the close one and every allowed one named."""
    public = sorted({k for k, v in SPELLED.items() if v in allowed}
                    | {a for a in allowed if a not in SPELLED.values() and a not in INTERNAL})
    raise UsageError(f"unknown keyword {key!r}{did_you_mean(key, public)}; allowed: {', '.join(public)}")


def _checked(key: str, name: str, value: object, kw: Mapping[str, object]) -> object:
    """`value` of keyword `key` (flag `name`, click settings `kw`) checked as its flag is: a list,
    a bool, a click type's conversion or a string."""
    kind = kw.get("type")
    if kw.get("multiple") or name in ("command", "data", "setup", "env", "env_file", "secret"):
        listed = _listed(key, value)
        return tuple(_typed(kind, v) for v in listed) if isinstance(kind, click.ParamType) else listed
    if kw.get("is_flag") or name in ("keep", "yes", "check"):
        if not isinstance(value, bool):
            raise UsageError(f"{key}={value!r} is not allowed: True or False")
        return value
    if isinstance(kind, click.ParamType):
        return _typed(kind, value)
    if not isinstance(value, str):
        raise UsageError(f"{key}={value!r} is not allowed: a string")
    return value
