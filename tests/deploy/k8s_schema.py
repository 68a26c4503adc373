"""Validates Kubernetes objects offline against the API's own types, as
Debian's python3-kubernetes generates them from the Kubernetes OpenAPI spec:
every model class lists each field's JSON name and type (openapi_types,
attribute_map) and its constructor requires the required ones.

  errors = validate(obj)   # [] when obj is a valid object of a built-in kind

Checks: the apiVersion serves the kind (an API group class has a create call
for it) and whether it is namespaced; no unknown field anywhere; every value
of the declared type (string, integer, boolean, list, map, int-or-string,
nested object); required fields present; resource quantities, names, label
keys and values, and port names well formed. Custom resources (the Prometheus
Operator's kinds) have no model here; kind_known() says which are checked.
"""
import inspect
import re

import kubernetes.client as kc

_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


def _camel(s: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[.-]", s) if p)


def _snake(kind: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()


def _api_class(api_version: str):
    group, _, version = api_version.rpartition("/")
    group = group.replace(".k8s.io", "") if group else "core"
    return getattr(kc, f"{_camel(group)}{_camel(version)}Api", None), version


def _model(api_version: str, kind: str):
    _, version = _api_class(api_version)
    return getattr(kc, f"{version[:1].upper()}{version[1:]}{kind}", None)


def kind_known(obj: dict) -> bool:
    api, _ = _api_class(obj.get("apiVersion", ""))
    return api is not None and _model(obj["apiVersion"], obj.get("kind", "")) is not None


def _required(model) -> set:
    """Attributes the model's constructor sets unconditionally (required)."""
    src = inspect.getsource(model.__init__)
    return set(re.findall(r"^ {8}self\.(\w+) = \1$", src, re.M)) & set(model.attribute_map)


_REQUIRED = {}


def _check(value, typ: str, path: str, errors: list) -> None:
    if value is None:
        return
    if typ.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            _check(v, typ[5:-1], f"{path}[{i}]", errors)
        return
    if typ.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        inner = typ[5:-1].split(", ", 1)[1]
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: key {k!r} is not a string")
            _check(v, inner, f"{path}.{k}", errors)
        return
    simple = {"str": str, "bool": bool, "float": (int, float), "datetime": str, "date": str}
    if typ in simple:
        if not isinstance(value, simple[typ]) or (typ == "float" and isinstance(value, bool)):
            errors.append(f"{path}: expected {typ}, got {type(value).__name__} {value!r}")
        return
    if typ == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: expected an integer, got {type(value).__name__} {value!r}")
        return
    if typ == "object":  # IntOrString, Quantity and free-form fields
        if isinstance(value, (dict, list)) and not path.endswith(("raw", "value")):
            return
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            errors.append(f"{path}: expected an integer or a string, got {value!r}")
        return
    model = getattr(kc, typ, None)
    if model is None:
        errors.append(f"{path}: the schema names an unknown type {typ}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({typ}), got {type(value).__name__}")
        return
    json_to_attr = {j: a for a, j in model.attribute_map.items()}
    for key, v in value.items():
        attr = json_to_attr.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field (not in {typ})")
            continue
        _check(v, model.openapi_types[attr], f"{path}.{key}", errors)
    if typ not in _REQUIRED:
        _REQUIRED[typ] = _required(model)
    for attr in sorted(_REQUIRED[typ]):
        if value.get(model.attribute_map[attr]) is None:
            errors.append(f"{path}.{model.attribute_map[attr]}: required field missing")
    _check_formats(value, typ, path, errors)


def _check_formats(value: dict, typ: str, path: str, errors: list) -> None:
    if typ == "V1ResourceRequirements":
        for part in ("requests", "limits"):
            for name, q in (value.get(part) or {}).items():
                if not _QUANTITY.match(str(q)):
                    errors.append(f"{path}.{part}.{name}: {q!r} is not a quantity")
    if typ == "V1ObjectMeta":
        for part, check_value in (("labels", True), ("annotations", False)):
            for k, v in (value.get(part) or {}).items():
                prefix, _, name = k.rpartition("/")
                if (prefix and not _DNS1123_SUBDOMAIN.match(prefix)) or len(name) > 63 or \
                        not _LABEL_NAME.match(name):
                    errors.append(f"{path}.{part}: {k!r} is not a valid key")
                if check_value and (len(str(v)) > 63 or not _LABEL_VALUE.match(str(v))):
                    errors.append(f"{path}.labels.{k}: {v!r} is not a valid label value")
        name = value.get("name")
        if name is not None and (len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name)):
            errors.append(f"{path}.name: {name!r} is not a DNS subdomain")
    if typ in ("V1ContainerPort", "V1ServicePort"):
        name = value.get("name")
        if name is not None and (len(name) > 15 or not _PORT_NAME.match(name)):
            errors.append(f"{path}.name: {name!r} is not a valid port name (<= 15 characters)")
    if typ in ("V1Container", "V1Volume", "V1VolumeMount"):
        name = value.get("name")
        if name is not None and (len(name) > 63 or not _DNS1123_LABEL.match(name)):
            errors.append(f"{path}.name: {name!r} is not a DNS label")
    if typ == "V1EnvVar" and not _ENV_NAME.match(value.get("name") or ""):
        errors.append(f"{path}.name: {value.get('name')!r} is not a valid variable name")


def validate(obj: dict) -> list:
    """Every schema error in one built-in object (empty when valid)."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    where = f"{kind}/{(obj.get('metadata') or {}).get('name', '?')}"
    api, _ = _api_class(api_version)
    model = _model(api_version, kind) if api else None
    if api is None or model is None:
        return [f"{where}: no schema for apiVersion {api_version!r} kind {kind!r}"]
    snake = _snake(kind)
    namespaced = hasattr(api, f"create_namespaced_{snake}")
    if not namespaced and not hasattr(api, f"create_{snake}"):
        return [f"{where}: apiVersion {api_version} does not serve kind {kind}"]
    errors = []
    has_ns = bool((obj.get("metadata") or {}).get("namespace"))
    if namespaced and not has_ns:
        errors.append(f"{where}: a namespaced object without metadata.namespace")
    if not namespaced and has_ns:
        errors.append(f"{where}: {kind} is cluster-scoped but has a namespace")
    _check(obj, model.__name__, where, errors)
    return errors
