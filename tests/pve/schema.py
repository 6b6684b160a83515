"""Request validation against the official PVE API schema, read at run time from beside the clone.

The schema (pve-docs' ``apidata.js`` as JSON) is GPL/AGPL: it is never copied into this repository.
Validation covers what the driver can get wrong: unknown paths and methods, unknown or missing
parameters, types (booleans only as 1/0, which is what the driver promises to send), enums, bounds,
lengths, simple regex patterns, property strings (``net0``, ``memory``) and the formats we use;
and the simulator's answers against the documented return types (required fields, types, enums).
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from urllib.parse import unquote

SCHEMA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "proxmox-api-schema"
SCHEMA_FILE = SCHEMA_DIR / "apidata-v9.json"

_DNS_NAME = re.compile(r"([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?\.)*[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?")
_TAG = re.compile(r"[a-z0-9_][a-z0-9_\-+.]*", re.IGNORECASE)
_SIMPLE_FORMATS = {
    "pve-node": re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"),
    "dns-name": _DNS_NAME,
    "pve-configid": re.compile(r"[a-z][a-z0-9_]+", re.IGNORECASE),
    "pve-storage-id": re.compile(r"[a-z][a-z0-9\-_.]*[a-z0-9]", re.IGNORECASE),
    "pve-bridge-id": re.compile(r"[-_.\w\d]+"),
    "mac-addr": re.compile(r"[a-f0-9]{2}(:[a-f0-9]{2}){5}", re.IGNORECASE),
}


class Schema:
    def __init__(self, path: Path = SCHEMA_FILE):
        # A tree of path segments; a literal segment wins over a "{param}" one, as in PVE's router.
        self.tree: dict = {}
        for root in json.loads(path.read_text()):
            self._add(root)

    def _add(self, node: dict) -> None:
        branch = self.tree
        for segment in node["path"].strip("/").split("/"):
            branch = branch.setdefault(segment, {})
        branch[None] = node
        for child in node.get("children") or []:
            self._add(child)

    def endpoint(self, path: str, method: str) -> tuple[str, dict, dict[str, str]]:
        """The route's template, the method's schema and the path's parameters (or PVE's 501)."""
        branch, params = self.tree, {}
        for segment in path.strip("/").split("/"):
            if segment in branch:
                branch = branch[segment]
                continue
            variable = next((k for k in branch if k and k.startswith("{")), None)
            if variable is None:
                raise SchemaError(501, f"Method '{method} {path}' not implemented")
            params[variable[1:-1]] = unquote(segment)
            branch = branch[variable]
        node = branch.get(None, {})
        info = node.get("info", {}).get(method)
        if info is None:
            raise SchemaError(501, f"Method '{method} {path}' not implemented")
        return node["path"], info, params

    def validate(self, info: dict, params: dict[str, str]) -> dict[str, str]:
        """PVE's per-parameter error messages; empty when the request is valid."""
        spec = info.get("parameters") or {}
        properties = spec.get("properties") or {}
        errors = {}
        for name, value in params.items():
            prop = properties.get(name) or properties.get(re.sub(r"\d+$", "[n]", name))
            if prop is None:
                if spec.get("additionalProperties", 1) != 0:
                    continue
                errors[name] = (
                    "property is not defined in schema and the schema does not allow additional properties"
                )
                continue
            message = check_value(prop, value)
            if message:
                errors[name] = message
        for name, prop in properties.items():
            if "[n]" not in name and not prop.get("optional") and name not in params:
                errors[name] = "property is missing and it is not optional"
        return errors


class SchemaError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def check_value(prop: dict, value: str) -> str | None:
    kind = prop.get("type", "string")
    if kind == "boolean":
        return None if value in ("0", "1") else f"type check ('boolean') failed - got '{value}' (send 1 or 0)"
    if kind in ("integer", "number"):
        try:
            number = int(value) if kind == "integer" else float(value)
        except ValueError:
            return f"type check ('{kind}') failed - got '{value}'"
        if "minimum" in prop and number < float(prop["minimum"]):
            return f"value must have a minimum value of {prop['minimum']}"
        if "maximum" in prop and number > float(prop["maximum"]):
            return f"value must have a maximum value of {prop['maximum']}"
        return None
    if kind != "string":
        return None
    if "enum" in prop and value not in prop["enum"]:
        return f"value '{value}' does not have a value in the enumeration '{', '.join(prop['enum'])}'"
    if "maxLength" in prop and len(value) > int(prop["maxLength"]):
        return f"value may only be {prop['maxLength']} characters long"
    if "pattern" in prop and not re.fullmatch(prop["pattern"], value):
        return "value does not match the regex pattern"
    fmt = prop.get("format")
    if isinstance(fmt, dict):
        return _check_property_string(fmt, value)
    return _check_format(fmt, value) if fmt else None


def _check_property_string(fmt: dict, value: str) -> str | None:
    default_key = next((k for k, v in fmt.items() if v.get("default_key")), None)
    for part in value.split(","):
        key, sep, sub = part.partition("=")
        if not sep:
            key, sub = default_key, part
        if key not in fmt:
            return f"invalid format - property '{key}' is not defined in the format"
        sub_prop = fmt[key]
        if "keyAlias" in sub_prop:  # "virtio=MAC" means model=virtio,macaddr=MAC
            sub_prop = fmt[sub_prop["alias"]]
        message = check_value(sub_prop, sub)
        if message:
            return f"invalid format - {key}: {message}"
    return None


def _check_format(fmt: str, value: str) -> str | None:
    if fmt == "urlencoded":
        return None if re.fullmatch(r"[A-Za-z0-9%._~+-]*", value) else "value is not URL-encoded"
    if fmt == "pve-tag-list":
        tags = re.split(r"[;, ]+", value.strip(";, "))
        return None if all(_TAG.fullmatch(t) for t in tags) else f"invalid tag list '{value}'"
    if fmt == "pve-qm-ipconfig":
        for part in value.split(","):
            key, _, sub = part.partition("=")
            if key not in ("ip", "gw", "ip6", "gw6"):
                return f"invalid format - unknown key '{key}'"
            if key == "ip" and sub != "dhcp" and not _is_network(sub):
                return f"invalid format - ip: '{sub}' is not dhcp nor an IPv4/CIDR"
        return None
    if fmt == "IPorCIDRorAlias":
        return None if _is_network(value) or re.fullmatch(r"[A-Za-z][\w-]*", value) else "invalid IP/CIDR"
    pattern = _SIMPLE_FORMATS.get(fmt)
    if pattern and not pattern.fullmatch(value):
        return f"value does not match the format '{fmt}'"
    return None


def _is_network(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


def return_errors(returns: dict, value: object, where: str = "data") -> list[str]:
    """Where a simulated answer departs from the documented return type (keeps the simulator honest)."""
    kind = returns.get("type")
    if value is None:
        return [] if kind in (None, "null") or returns.get("optional") else [f"{where} is null"]
    expected = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": (bool, int),
    }.get(kind)
    # Perl's JSON encoder often sends numbers as strings (real PVE answers nextid with "100").
    numeric_text = kind in ("integer", "number") and isinstance(value, str) and _is_number(value)
    if expected and not isinstance(value, expected) and not numeric_text:
        return [f"{where} is {type(value).__name__}, the schema says {kind}"]
    if "enum" in returns and value not in returns["enum"]:
        return [f"{where} is {value!r}, not one of {', '.join(returns['enum'])}"]
    errors = []
    if isinstance(value, dict):
        for name, prop in (returns.get("properties") or {}).items():
            if name in value:
                errors += return_errors(prop, value[name], f"{where}.{name}")
            elif not prop.get("optional"):
                errors.append(f"{where}.{name} is missing")
    elif isinstance(value, list) and returns.get("items"):
        for i, item in enumerate(value):
            errors += return_errors(returns["items"], item, f"{where}[{i}]")
    return errors


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
