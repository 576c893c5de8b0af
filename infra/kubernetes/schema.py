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
from typing import Any

KINDS = {("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Service"): "V1Service", ("v1", "Secret"): "V1Secret",
         ("v1", "Namespace"): "V1Namespace", ("v1", "ServiceAccount"): "V1ServiceAccount",
         ("batch/v1", "Job"): "V1Job", ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy"}
_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict[\[(]([^,]+), (.+)[\])]$")  # dict(str, T) or dict[str, T], as client versions write it


def model_of(doc: dict[str, Any]) -> str | None:
    return KINDS.get((str(doc.get("apiVersion")), str(doc.get("kind"))))


def _check(value: Any, kind: str, path: str, out: list[str]) -> None:
    import kubernetes.client.models as models

    if value is None:
        return
    if kind == "object":
        return
    if kind == "str" or kind == "datetime" or kind == "date":
        if not isinstance(value, str):
            out.append(f"{path}: {type(value).__name__} {value!r} where the schema has a string")
        return
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            out.append(f"{path}: {type(value).__name__} {value!r} where the schema has an integer")
        return
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            out.append(f"{path}: {type(value).__name__} {value!r} where the schema has a number")
        return
    if kind == "bool":
        if not isinstance(value, bool):
            out.append(f"{path}: {type(value).__name__} {value!r} where the schema has a boolean")
        return
    listed = _LIST.match(kind)
    if listed:
        if not isinstance(value, list):
            out.append(f"{path}: {type(value).__name__} where the schema has a list")
            return
        for i, item in enumerate(value):
            _check(item, listed.group(1), f"{path}[{i}]", out)
        return
    mapped = _DICT.match(kind)
    if mapped:
        if not isinstance(value, dict):
            out.append(f"{path}: {type(value).__name__} where the schema has a map")
            return
        for k, item in value.items():
            _check(k, mapped.group(1), f"{path} key", out)
            _check(item, mapped.group(2), f"{path}[{k!r}]", out)
        return
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


def errors(doc: dict[str, Any]) -> list[str]:
    """What the API server's strict validation would refuse in `doc` (its own kind's schema)."""
    model = model_of(doc)
    if model is None:
        return [f"{doc.get('apiVersion')}/{doc.get('kind')}: no schema here to check it against"]
    out: list[str] = []
    _check(doc, model, "", out)
    return out
