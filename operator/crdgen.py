"""Generate the CRDs from the pydantic models: InferenceService from ``tidal.operator.core.api``,
ModelBuild from ``tidal.operator.core.buildapi``.

    python -m tidal.operator.crdgen crds/          # writes crds/<plural>.<group>.yaml (both kinds)
    python -m tidal.operator.crdgen --check crds/  # exits 1 when the file differs
    python -m tidal.operator.crdgen --readme operator/README.md crds/  # and the rules table

The rules table (the operator README's "Rules across fields" section, between its markers) lists
every rule the API server checks on an object of the spec beyond its fields' own types (the CEL
``x-kubernetes-validations`` of the models, read from the CRD built here) and every setting rule
of :data:`tidal.operator.core.rules.SETTING_RULES`, with what the user sees.

Pydantic emits JSON Schema (draft 2020-12); Kubernetes wants a *structural* OpenAPI v3 schema.
The translation inlines ``$ref``s, turns ``anyOf [X, null]`` into an optional X, rewrites
numeric exclusive bounds to OpenAPI 3.0's boolean form, ``const`` to a one-value ``enum``,
drops what structural schemas forbid (``additionalProperties: false``, ``title``), and keeps
descriptions, defaults, bounds, patterns, enums and ``x-kubernetes-*`` extensions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from .core import api, buildapi
from .core.rules import SETTING_RULES

_DROP = {"title", "examples", "discriminator"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        # Siblings of a $ref (description, default from the field) override the target's.
        node = {**target, **node}
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        node = {**_resolve(inner, defs), **node}
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            node.pop("anyOf")
            node = {**_resolve(options[0], defs), **node}
            if node.get("default", 0) is None:
                node.pop("default")
    return {k: _resolve(v, defs) for k, v in node.items()}


def _structural(node: Any) -> Any:
    if isinstance(node, list):
        return [_structural(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
            continue
        if key == "properties":
            out[key] = {name: _structural(prop) for name, prop in value.items()}
            continue
        out[key] = _structural(value)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    # Optional fields with defaults of None would otherwise serialise as `default: null`.
    if out.get("default", 0) is None:
        out.pop("default")
    # A stable, readable key order: what it is, what it means, then the constraints.
    first = [k for k in ("type", "description", "default", "enum") if k in out]
    return {k: out[k] for k in [*first, *sorted(k for k in out if k not in first)]}


def _defaults_of(node: dict[str, Any]) -> dict[str, Any]:
    """The object an empty ``{}`` becomes after defaulting (recursively)."""
    out: dict[str, Any] = {}
    for name, prop in node.get("properties", {}).items():
        if "default" in prop:
            out[name] = prop["default"]
    return out


def _expand_empty_defaults(node: Any) -> Any:
    """Replace ``default: {}`` with the defaulted object.

    The API server checks a default against the schema's CEL rules *without* defaulting its
    fields first, so ``{}`` would fail rules such as ``self.minReplicas <= self.maxReplicas``.
    """
    if isinstance(node, list):
        return [_expand_empty_defaults(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {k: _expand_empty_defaults(v) for k, v in node.items()}
    if node.get("default") == {} and "properties" in node:
        node["default"] = _defaults_of(node)
    return node


def schema_of(model: type[api.ApiModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one API model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return dict(_expand_empty_defaults(_structural(_resolve(raw, defs))))


# `kubectl get inferenceservices`' columns.
PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Whether the active pool has ready replicas behind the Service.",
    },
    {
        "name": "Replicas",
        "type": "integer",
        "jsonPath": ".status.readyReplicas",
        "description": "Ready replicas of the active pool.",
    },
    {
        "name": "Desired",
        "type": "integer",
        "jsonPath": ".status.desiredReplicas",
        "description": "Replicas the operator asks for.",
        "priority": 1,
    },
    {
        "name": "P99",
        "type": "number",
        "jsonPath": ".status.metrics.p99HotMs",
        "description": "Hot-path P99 latency in milliseconds.",
    },
    {
        "name": "Pool",
        "type": "string",
        "jsonPath": ".status.activePool",
        "description": "The pool that gets traffic.",
    },
    {
        "name": "Models",
        "type": "string",
        "jsonPath": ".status.fleet.summary",
        "description": "With spec.fleet: models hot on some replica / models.",
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
        "priority": 1,
    },
    {
        "name": "Decision",
        "type": "string",
        "jsonPath": ".status.lastDecision.reason",
        "description": "The autoscaler's last decision, e.g. surge:rate or hold:metrics-stale.",
        "priority": 1,
    },
    {
        "name": "Rollout",
        "type": "string",
        "jsonPath": ".status.rollout.phase",
        "description": "With a baseline: Stable, Preparing, Progressing, RolledBack, Pinned "
        "or Overflow.",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition as a plain dict."""
    spec_schema = schema_of(api.InferenceServiceSpec)
    status_schema = schema_of(api.InferenceServiceStatus)
    root: dict[str, Any] = {
        "type": "object",
        "description": (api.InferenceService.__doc__ or "").strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "serving.tidal.dev/v1alpha1"},
            "kind": {"type": "string", "description": "InferenceService"},
            "metadata": api.METADATA_SCHEMA,
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    extra = api.InferenceService.model_config.get("json_schema_extra")
    if isinstance(extra, dict):
        root.update(extra)
    names = (api.KIND, api.PLURAL, api.SINGULAR, api.SHORT_NAMES, api.CATEGORIES)
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    return _crd(names, root, {"status": {}, "scale": scale}, list(PRINTER_COLUMNS))


def _crd(
    names: tuple[str, str, str, tuple[str, ...], tuple[str, ...]],
    root: dict[str, Any],
    subresources: dict[str, Any],
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    """A namespaced CRD of this group with one served, stored version."""
    kind, plural, singular, short_names, categories = names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(categories),
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                }
            ],
        },
    }


def build_model_build_crd() -> dict[str, Any]:
    """The ModelBuild CustomResourceDefinition as a plain dict."""
    root: dict[str, Any] = {
        "type": "object",
        "description": (buildapi.ModelBuild.__doc__ or "").strip(),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": api.API_VERSION},
            "kind": {"type": "string", "description": buildapi.BUILD_KIND},
            "metadata": buildapi.BUILD_METADATA_SCHEMA,
            "spec": schema_of(buildapi.ModelBuildSpec),
            "status": schema_of(buildapi.ModelBuildStatus),
        },
    }
    columns: list[dict[str, Any]] = [
        {
            "name": "Model",
            "type": "string",
            "jsonPath": ".spec.model",
            "description": "The model built.",
        },
        {
            "name": "Version",
            "type": "string",
            "jsonPath": ".spec.version",
            "description": "The version built.",
        },
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            "description": "Every target built and every engine published.",
        },
        {
            "name": "Engines",
            "type": "string",
            "jsonPath": ".status.summary",
            "description": "Engines published / engines asked for.",
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            "priority": 1,
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    names = (
        buildapi.BUILD_KIND,
        buildapi.BUILD_PLURAL,
        buildapi.BUILD_SINGULAR,
        buildapi.BUILD_SHORT_NAMES,
        ("tidal",),
    )
    return _crd(names, root, {"status": {}}, columns)


HEADER = (
    "# Generated by `python -m tidal.operator.crdgen crds/` from tidal/operator/core/api.py.\n"
    "# Do not edit: change the pydantic models and regenerate (a test fails on drift).\n"
)


def render() -> str:
    """The InferenceService CRD file's exact text."""
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def render_model_build() -> str:
    """The ModelBuild CRD file's exact text."""
    header = HEADER.replace("core/api.py", "core/buildapi.py")
    return header + yaml.safe_dump(build_model_build_crd(), sort_keys=False, width=100)


def crd_path(directory: Path) -> Path:
    return directory / f"{api.PLURAL}.{api.GROUP}.yaml"


def model_build_crd_path(directory: Path) -> Path:
    return directory / f"{buildapi.BUILD_PLURAL}.{api.GROUP}.yaml"


RULES_BEGIN = "<!-- rules table: generated by `make crds` (tidal.operator.crdgen); do not edit -->"
RULES_END = "<!-- end of rules table -->"
REFUSED = "refused by the API server (422), the message naming the field"


def admission_rules(crd: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """(field, message) of every CEL rule the CRD (the InferenceService's unless given) sets
    on an object of ``spec`` (structured objects only: a rule there reads more than one
    value), each message once, in schema order (a rule the baseline's override repeats is
    listed at the primary's field)."""
    crd = crd if crd is not None else build_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found: dict[str, str] = {}

    def walk(node: dict[str, Any], path: str) -> None:
        if "properties" in node:
            for rule in node.get("x-kubernetes-validations", []):
                at = path + rule.get("fieldPath", "")
                found.setdefault(rule["message"], at)
            for name, child in node["properties"].items():
                walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(root, "spec")
    return [(field, message) for message, field in found.items()]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rules_table() -> str:
    """The README's rules table (markdown, between its markers)."""
    lines = [
        RULES_BEGIN,
        "| Field | Rule | What the user sees |",
        "|---|---|---|",
    ]
    for rule in SETTING_RULES:
        seen = (
            f"`Degraded={rule.outcome.value}` and a Warning Event naming the field; the "
            f"service is built and serves (`{rule.id}`)"
        )
        lines.append(f"| `{_cell(rule.field)}` | {_cell(rule.condition)} | {seen} |")
    for field, message in admission_rules():
        lines.append(f"| `{_cell(field)}` | {_cell(message)} | {REFUSED} |")
    for field, message in admission_rules(build_model_build_crd()):
        lines.append(f"| `{_cell(field)}` of a ModelBuild | {_cell(message)} | {REFUSED} |")
    lines.append(RULES_END)
    return "\n".join(lines)


def with_rules_table(readme: str) -> str:
    """``readme`` with the text between the rules table's markers replaced."""
    start, end = readme.index(RULES_BEGIN), readme.index(RULES_END) + len(RULES_END)
    return readme[:start] + rules_table() + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where to write the CRD (e.g. crds/)")
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    parser.add_argument("--readme", type=Path, help="a README whose rules table to write too")
    args = parser.parse_args(argv)
    outputs = [
        (crd_path(args.directory), render()),
        (model_build_crd_path(args.directory), render_model_build()),
    ]
    if args.readme is not None:
        outputs.append((args.readme, with_rules_table(args.readme.read_text())))
    if args.check:
        stale = [p for p, t in outputs if not p.exists() or p.read_text() != t]
        for p in stale:
            print(f"{p} is out of date: run make crds")
        return 1 if stale else 0
    args.directory.mkdir(parents=True, exist_ok=True)
    for p, t in outputs:
        p.write_text(t)
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
