"""A manifest (the JSON the API server receives) checked against the Kubernetes API schema, field by field, as
the API server's strict field validation would (Kubernetes docs, "Field validation": `fieldValidation=Strict`
fails a request with an unknown or duplicate field; a value of the wrong type is refused by decoding).

The schema is the one the kubernetes Python client is generated from (the OpenAPI spec of its Kubernetes
release): each model class names its fields (`attribute_map`: Python name -> JSON name) and their types
(`openapi_types`: `str`, `int`, `bool`, `float`, `datetime`, `object`, `list[T]`, `dict[str, T]` or another
model). The client's own deserializer ignores unknown fields and does not check types; this walk does both.
`errors(doc)`: every problem, each naming its path (`spec.template.spec.containers[0].resources.limits`); []
when the manifest is valid. A kind the client has no model of (a CRD such as Kubeflow's PyTorchJob) is not
checked: `model_of` says None.
"""

from __future__ import annotations

import re
from typing import Callable

from gpucluster.states import JsonMapping

KINDS = {("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Service"): "V1Service", ("v1", "Secret"): "V1Secret",
         ("v1", "Namespace"): "V1Namespace", ("v1", "ServiceAccount"): "V1ServiceAccount",
         ("batch/v1", "Job"): "V1Job", ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy"}
_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict[\[(]([^,]+), (.+)[\])]$")  # dict(str, T) or dict[str, T], as client versions write it


def model_of(doc: JsonMapping) -> str | None:
    return KINDS.get((str(doc.get("apiVersion")), str(doc.get("kind"))))


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


# The schema's scalar types: the test a JSON value passes, and what the refusal calls the type.
_SCALARS: dict[str, tuple[Callable[[object], bool], str]] = {
    "str": (_is_str, "a string"), "datetime": (_is_str, "a string"), "date": (_is_str, "a string"),
    "int": (_is_int, "an integer"), "float": (_is_number, "a number"), "bool": (_is_bool, "a boolean"),
}


def _check(value: object, kind: str, path: str, out: list[str]) -> None:
    """`value` against the schema's type `kind` at `path`; each problem appended to `out`."""
    if value is None or kind == "object":
        return
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        if not scalar[0](value):
            out.append(f"{path}: {type(value).__name__} {value!r} where the schema has {scalar[1]}")
        return
    listed = _LIST.match(kind)
    if listed:
        _check_list(value, listed.group(1), path, out)
        return
    mapped = _DICT.match(kind)
    if mapped:
        _check_map(value, mapped.group(1), mapped.group(2), path, out)
        return
    _check_model(value, kind, path, out)


def _check_list(value: object, item_kind: str, path: str, out: list[str]) -> None:
    if not isinstance(value, list):
        out.append(f"{path}: {type(value).__name__} where the schema has a list")
        return
    for i, item in enumerate(value):
        _check(item, item_kind, f"{path}[{i}]", out)


def _check_map(value: object, key_kind: str, item_kind: str, path: str, out: list[str]) -> None:
    if not isinstance(value, dict):
        out.append(f"{path}: {type(value).__name__} where the schema has a map")
        return
    for k, item in value.items():
        _check(k, key_kind, f"{path} key", out)
        _check(item, item_kind, f"{path}[{k!r}]", out)


def _check_model(value: object, kind: str, path: str, out: list[str]) -> None:
    """A model of the client (`attribute_map`, `openapi_types`): every field known, each of its type."""
    import kubernetes.client.models as models

    model = getattr(models, kind, None)
    if model is None:
        out.append(f"{path}: the schema's type {kind} is unknown to this kubernetes client")
        return
    if not isinstance(value, dict):
        out.append(f"{path}: {type(value).__name__} where the schema has a {kind} object")
        return
    by_json = {json_name: py for py, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            out.append(f"{path + '.' if path else ''}{key}: unknown field of {kind}")
            continue
        _check(item, model.openapi_types[by_json[key]], f"{path + '.' if path else ''}{key}", out)


def errors(doc: JsonMapping) -> list[str]:
    """What the API server's strict validation would refuse in `doc` (its own kind's schema)."""
    model = model_of(doc)
    if model is None:
        return [f"{doc.get('apiVersion')}/{doc.get('kind')}: no schema here to check it against"]
    out: list[str] = []
    _check(doc, model, "", out)
    return out
