#!/usr/bin/env python3
"""Validates Kubernetes objects strictly against their schemas and prints a verdict per object.

  validate.py [OPTIONS] FILE|FOLDER...              every object of every (*.yaml under a) file must be valid
  validate.py [OPTIONS] --render QUOTAD POLICY      the same for what `QUOTAD render-k8s --policy POLICY` prints
  validate.py [OPTIONS] --expect-invalid FILE...    every object must be rejected, with the error its annotation
                                                    yolo8.io/expected-error names (a substring of a reason)
Options:
  --crds DIR           the CustomResourceDefinitions (default: ../shared/crds beside the repository)
  --require SOURCE,... fail unless at least one object was checked against each of these schema sources
                       (kubernetes, kueue, prometheus-operator)

Schemas, all read from disk (nothing downloads):
  - built-in kinds: the official OpenAPI schemas of Kubernetes 1.26 (the oldest deploy/README.md supports) and
    1.35 (the newest kubernetes-validate 1.35.0 ships), in kubernetes-validate's strict form (an unknown field or
    a wrong type fails); an object must be valid in both.
  - kueue.x-k8s.io: the CRDs of every Kueue release under DIR/kueue from v0.6.0 on (deploy/README.md: "Kueue
    v0.6+"); an object must be served by and valid in each.
  - monitoring.coreos.com: the CRDs under DIR/prometheus-operator (Prometheus Operator 0.93.0).
  A CRD's openAPIV3Schema is read as the API server reads a structural schema: a field it does not list is
  unknown (rejected) unless x-kubernetes-preserve-unknown-fields, nullable, x-kubernetes-int-or-string, the
  schema's defaults are applied first, list-type map/set entries must be unique, and the x-kubernetes-validations
  rules that kCelRules below re-expresses are evaluated (others are listed as not evaluated).
On top of the schemas: the API server's name rules (apimachinery), which the schemas cannot express.
Exit: 0 as expected, 1 otherwise, 77 (CTest skip) when the Python packages or the CRDs are missing.
"""
import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

kSkip = 77
kExpectedErrorAnnotation = "yolo8.io/expected-error"

try:
    import importlib.resources
    import jsonschema
    import referencing
    import yaml
    import kubernetes_validate
    from kubernetes_validate.version import __version__ as kubernetes_validate_version
except ImportError as err:
    print(f"SKIP: the validator's Python packages are not installed ({err.name}); run scripts/setup.sh "
          "(scripts/pyenv.sh tools: .venv/tools from scripts/locks/tools.txt)")
    sys.exit(kSkip)

# The Kubernetes versions of the built-in kinds: the oldest we support (deploy/README.md: 1.26, podFailurePolicy)
# and the newest kubernetes-validate 1.35.0 ships. Both, since fields change between them (1.26 requires
# onPodConditions[].status, 1.35 does not).
kKubernetesVersions = ("1.26", "1.35")
# Errata of the official schemas, where the OpenAPI disagrees with the API server: (version, definition) -> the
# properties it wrongly lists as required. Kubernetes 1.26 to 1.28 list a podFailurePolicy rule's onPodConditions as
# required (a Go field without omitempty); the API server wants onExitCodes or onPodConditions, the 1.26
# documentation's own example has a rule with onExitCodes only, and the OpenAPI of 1.29 on no longer requires it.
kErrata = {("1.26", "io.k8s.api.batch.v1.PodFailurePolicyRule"): ["onPodConditions"]}
# CRD schema sources: folder under --crds -> (display name, oldest release our manifests claim or None).
kCrdSources = {
    "kueue": ("Kueue", "0.6.0"),
    "prometheus-operator": ("Prometheus Operator", None),
}


def version_key(text):
    return tuple(int(n) for n in re.findall(r"\d+", text))


# ---------------------------------------------------------------------------------------------------------------
# YAML as Kubernetes reads it (go-yaml v2 through sigs.k8s.io/yaml): YAML 1.1 booleans (yes/no/on/off/y/n),
# no timestamps (strings), no base-60 numbers, duplicate keys an error, keys as JSON strings.

class KubernetesLoader(yaml.SafeLoader):
    pass


KubernetesLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                           "tag:yaml.org,2002:bool", "tag:yaml.org,2002:value")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
KubernetesLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"))
KubernetesLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"))
KubernetesLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9_]+(?:[eE][-+][0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _construct_bool(loader, node):
    return loader.construct_scalar(node) in ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On",
                                             "ON")


def _json_key(key):
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    return str(key)


def _construct_mapping(loader, node):
    loader.flatten_mapping(node)
    mapping = {}
    for key_node, value_node in node.value:
        key = _json_key(loader.construct_object(key_node, deep=True))
        if key in mapping:
            raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                    f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


KubernetesLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
KubernetesLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


def documents(text, source):
    try:
        return [obj for obj in yaml.load_all(text, Loader=KubernetesLoader) if obj is not None]
    except yaml.YAMLError as err:
        raise ValueError(f"{source}: YAML: {' '.join(str(err).split())}") from None


# ---------------------------------------------------------------------------------------------------------------
# Messages in one style, "PATH must ...", PATH a JSON pointer ("/" for the whole object).

ValidationError = jsonschema.ValidationError


def _type(validator, types, instance, schema):
    types = [types] if isinstance(types, str) else list(types)
    if not any(validator.is_type(instance, t) for t in types):
        yield ValidationError(f"must be {' or '.join(t for t in types if t != 'null') or 'null'}")


def _required(validator, required, instance, schema):
    if validator.is_type(instance, "object"):
        for name in required:
            if name not in instance:
                yield ValidationError(f"must have required property {name}")


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    listed = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    extras = [k for k in instance if k not in listed and not any(re.search(p, k) for p in patterns)]
    if isinstance(additional, dict):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False:
        for key in extras:
            yield ValidationError("is an unknown field (not in the schema)", path=[key])


def _json(value):
    return json.dumps(int(value) if isinstance(value, float) and value.is_integer() else value, sort_keys=True)


def _enum(validator, values, instance, schema):
    if _json(instance) not in {_json(v) for v in values}:
        yield ValidationError(f"must be one of {', '.join(json.dumps(v) for v in values)} "
                              f"(not {json.dumps(instance)})")


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not re.search(pattern, instance):
        yield ValidationError(f'must match pattern "{pattern}" (not {json.dumps(instance)})')


kIntRanges = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


def _format(validator, fmt, instance, schema):
    bounds = kIntRanges.get(fmt)
    if bounds and validator.is_type(instance, "integer") and not bounds[0] <= instance <= bounds[1]:
        yield ValidationError(f"must be a {fmt} ({instance} is out of range)")


kKeywords = {"type": _type, "required": _required, "additionalProperties": _additional_properties,
             "enum": _enum, "pattern": _pattern, "format": _format}


# The x-kubernetes-validations rules of our CRDs (Kueue's), each re-expressed in Python, keyed by the exact CEL
# text; evaluated on the defaulted object as the API server does. A missing field is CEL's "no such key" (the rule
# fails). Transition rules (oldSelf) apply to updates only; a rule not listed here is reported as not evaluated.
kTaintEffects = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _no_borrowing_without(cohort_field):
    return lambda s: not (cohort_field not in s and "resourceGroups" in s) or all(
        "borrowingLimit" not in r for rg in s["resourceGroups"] for f in rg["flavors"] for r in f["resources"])


kCelRules = {
    "!has(self.cohort) && has(self.resourceGroups) ? self.resourceGroups.all(rg, rg.flavors.all(f, "
    "f.resources.all(r, !has(r.borrowingLimit)))) : true": _no_borrowing_without("cohort"),
    "!has(self.cohortName) && has(self.resourceGroups) ? self.resourceGroups.all(rg, rg.flavors.all(f, "
    "f.resources.all(r, !has(r.borrowingLimit)))) : true": _no_borrowing_without("cohortName"),
    "!(self.reclaimWithinCohort == 'Never' && has(self.borrowWithinCohort) &&  "
    "self.borrowWithinCohort.policy != 'Never')":
        lambda s: not (s["reclaimWithinCohort"] == "Never" and "borrowWithinCohort" in s
                       and s["borrowWithinCohort"]["policy"] != "Never"),
    "self.flavors.all(x, size(x.resources) == size(self.coveredResources))":
        lambda s: all(len(x["resources"]) == len(s["coveredResources"]) for x in s["flavors"]),
    "!has(self.topologyName) || self.nodeLabels.size() >= 1":
        lambda s: "topologyName" not in s or len(s["nodeLabels"]) >= 1,
    "self.all(x, x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])":
        lambda s: all(x["effect"] in kTaintEffects for x in s),
    "self.all(x, !has(x.key) ? x.operator == 'Exists' : true)":
        lambda s: all("key" in x or x["operator"] == "Exists" for x in s),
    "self.all(x, has(x.tolerationSeconds) ? x.effect == 'NoExecute' : true)":
        lambda s: all("tolerationSeconds" not in x or x["effect"] == "NoExecute" for x in s),
    "self.all(x, !has(x.operator) || x.operator in ['Equal', 'Exists'])":
        lambda s: all("operator" not in x or x["operator"] in ("Equal", "Exists") for x in s),
    "self.all(x, has(x.operator) && x.operator == 'Exists' ? !has(x.value) : true)":
        lambda s: all(not ("operator" in x and x["operator"] == "Exists") or "value" not in x for x in s),
    "self.all(x, !has(x.effect) || x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])":
        lambda s: all("effect" not in x or x["effect"] in kTaintEffects for x in s),
    "!has(self.preference) || (self.whenCanBorrow == 'TryNextFlavor' && self.whenCanPreempt == 'TryNextFlavor')":
        lambda s: "preference" not in s or (s["whenCanBorrow"] == "TryNextFlavor"
                                            and s["whenCanPreempt"] == "TryNextFlavor"),
}
unevaluated_rules = set()  # the rules met on an object but not in kCelRules


def _cel(validator, rules, instance, schema):
    for rule in rules:
        text = rule["rule"]
        if "oldSelf" in text:
            continue
        check = kCelRules.get(text)
        if check is None:
            unevaluated_rules.add(text)
            continue
        message = rule.get("message") or f"failed rule: {text}"
        try:
            ok = check(instance)
        except (KeyError, TypeError):
            ok, message = False, f"{message} (rule {text!r}: no such key)"
        if not ok:
            yield ValidationError(message)


def _list_type(validator, list_type, instance, schema):
    if not validator.is_type(instance, "array"):
        return
    seen = {}
    for index, item in enumerate(instance):
        if list_type["type"] == "map":
            if not isinstance(item, dict):
                continue
            key = tuple((k, json.dumps(item.get(k), sort_keys=True)) for k in list_type["keys"])
            shown = ", ".join(f"{k}={v}" for k, v in key)
        else:
            key = json.dumps(item, sort_keys=True)
            shown = key
        if key in seen:
            yield ValidationError(f"is a duplicate entry ({shown}) of item {seen[key]}", path=[index])
        else:
            seen[key] = index


BuiltinValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, kKeywords)
CrdValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {**kKeywords, "x-yolo8-cel": _cel, "x-yolo8-list-type": _list_type})


def pointer(path):
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path) if path else "/"


def messages(error):
    """The readable reasons of one jsonschema error: the branch errors of a oneOf/anyOf explained."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        if all(e.validator == "type" and not e.relative_path for e in error.context):
            types = []
            for e in error.context:
                for t in [e.validator_value] if isinstance(e.validator_value, str) else e.validator_value:
                    if t != "null" and t not in types:
                        types.append(t)
            return [f"{pointer(error.absolute_path)} must be {' or '.join(types)}"]
        return messages(jsonschema.exceptions.best_match(error.context))
    return [f"{pointer(error.absolute_path)} {error.message}"]


def schema_errors(validator, obj):
    reasons = []
    for error in validator.iter_errors(obj):
        for reason in messages(error):
            if reason not in reasons:
                reasons.append(reason)
    return reasons


# ---------------------------------------------------------------------------------------------------------------
# Built-in kinds: kubernetes-validate's strict schemas, one file per kind, $ref into _definitions.json.

class Kubernetes:
    def __init__(self):
        root = importlib.resources.files(kubernetes_validate).joinpath("kubernetes-json-schema")
        self.dirs = {}
        self.registries = {}
        for version in kKubernetesVersions:
            folder = root.joinpath(f"v{version}.0-local-strict")
            if not folder.joinpath("_definitions.json").is_file():
                raise SystemExit(f"FAIL kubernetes-validate {kubernetes_validate_version} has no strict schemas "
                                 f"of Kubernetes {version} (scripts/locks/tools.txt pins 1.35.0)")
            self.dirs[version] = folder
            definitions = json.loads(folder.joinpath("_definitions.json").read_text())
            for (erratum_version, name), fields in kErrata.items():
                if erratum_version == version:
                    definition = definitions["$defs"][name]
                    definition["required"] = [f for f in definition["required"] if f not in fields]
            self.registries[version] = referencing.Resource.from_contents(definitions) @ referencing.Registry()
        self.validators = {}

    def definitions_registry(self):
        return self.registries[kKubernetesVersions[-1]]

    def validator(self, version, api_version, kind):
        key = (version, api_version, kind)
        if key not in self.validators:
            group, _, ver = api_version.rpartition("/")
            prefix = f"{group.split('.')[0]}-" if group else ""
            path = self.dirs[version].joinpath(f"{kind.lower()}-{prefix}{ver}.json")
            validator = None
            if path.is_file():
                schema = json.loads(path.read_text())
                if {"group": group, "version": ver, "kind": kind} in schema.get("x-kubernetes-group-version-kind",
                                                                                 []):
                    validator = BuiltinValidator(schema, registry=self.registries[version])
            self.validators[key] = validator
        return self.validators[key]

    def check(self, obj):
        api_version, kind = obj["apiVersion"], obj["kind"]
        by_reason, missing = {}, []
        for version in kKubernetesVersions:
            validator = self.validator(version, api_version, kind)
            if validator is None:
                missing.append(version)
                continue
            for reason in schema_errors(validator, obj):
                by_reason.setdefault(reason, []).append(version)
        reasons = []
        if missing:
            reasons.append(f"no official schema for {api_version} {kind} (Kubernetes {', '.join(missing)})")
        reasons += [f"{r} (Kubernetes {', '.join(v)})" for r, v in by_reason.items()]
        return reasons, f"Kubernetes {', '.join(kKubernetesVersions)}"


# ---------------------------------------------------------------------------------------------------------------
# CRDs: openAPIV3Schema (OpenAPI v3, structural) to JSON Schema 2020-12 with the API server's semantics.

kObjectMetaRef = "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
kDropped = {"description", "default", "example", "externalDocs", "nullable", "x-kubernetes-int-or-string",
            "x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource", "x-kubernetes-map-type",
            "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-validations"}


def structural(node, in_junctor=False):
    out = {}
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {k: structural(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = structural(value)
        elif key == "not":
            out[key] = structural(value, True)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [structural(v, True) for v in value]
        elif key in ("exclusiveMaximum", "exclusiveMinimum"):
            bound = key.replace("exclusiveM", "m")
            if value is True and bound in node:
                out[key] = node[bound]
        elif key in ("maximum", "minimum"):
            if node.get("exclusiveM" + key[1:]) is not True:
                out[key] = value
        elif key not in kDropped:
            out[key] = value
    nullable = node.get("nullable") is True
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        if nullable:
            out["anyOf"] = out["anyOf"] + [{"type": "null"}]
    elif nullable and "type" in out:
        out["type"] = [out["type"], "null"]
    if nullable and "enum" in out:
        out["enum"] = list(out["enum"]) + [None]
    if node.get("x-kubernetes-embedded-resource"):
        out["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                             "metadata": {"$ref": kObjectMetaRef}, **out.get("properties", {})}
    if (node.get("type") == "object" and not in_junctor and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False  # the API server prunes (strict field validation rejects) the rest
    if node.get("x-kubernetes-list-type") in ("map", "set"):
        out["x-yolo8-list-type"] = {"type": node["x-kubernetes-list-type"],
                                    "keys": node.get("x-kubernetes-list-map-keys", [])}
    if node.get("x-kubernetes-validations"):
        out["x-yolo8-cel"] = node["x-kubernetes-validations"]
    return out


def apply_defaults(value, schema):
    """The schema's defaults, applied as the API server does before validating (in place)."""
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key, sub in properties.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(value[key], sub)
        if isinstance(schema.get("additionalProperties"), dict):
            for key in value:
                if key not in properties:
                    apply_defaults(value[key], schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(item, schema["items"])


class CrdSource:
    """The CRDs of one project under --crds: NAME/RELEASE/*.yaml, or NAME/*.yaml with the release in the CRDs'
    version annotation."""

    def __init__(self, folder, title, oldest, registry):
        self.name, self.title = folder.name, title
        self.releases = {}  # release -> {(group, kind): CRD}
        for path in sorted(folder.rglob("*.y*ml")):
            for crd in documents(path.read_text(), str(path)):
                if crd.get("kind") != "CustomResourceDefinition":
                    continue
                release = path.parent.name if path.parent != folder else next(
                    (v for k, v in crd["metadata"].get("annotations", {}).items()
                     if k.endswith("/version") and not k.startswith("controller-gen")), "?")
                if oldest and version_key(release) < version_key(oldest):
                    continue
                self.releases.setdefault(release, {})[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = crd
        self.releases = dict(sorted(self.releases.items(), key=lambda kv: version_key(kv[0])))
        self.groups = {group for crds in self.releases.values() for group, _ in crds}
        self.registry = registry
        self.validators = {}
        self.deprecated = set()  # (api_version kind, release, warning)

    def label(self):
        return f"{self.title} {', '.join(self.releases)}"

    def schema(self, release, api_version, kind):
        key = (release, api_version, kind)
        if key not in self.validators:
            group, _, ver = api_version.rpartition("/")
            crd = self.releases[release].get((group, kind))
            entry = next((v for v in (crd or {}).get("spec", {}).get("versions", [])
                          if v["name"] == ver and v.get("served")), None)
            if entry is None:
                self.validators[key] = None
            else:
                original = entry["schema"]["openAPIV3Schema"]
                schema = structural(original)
                schema["properties"]["metadata"] = {"$ref": kObjectMetaRef}
                schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
                self.validators[key] = (original, CrdValidator(schema, registry=self.registry), entry)
        return self.validators[key]

    def check(self, obj):
        api_version, kind = obj["apiVersion"], obj["kind"]
        by_reason, missing = {}, []
        for release in self.releases:
            found = self.schema(release, api_version, kind)
            if found is None:
                missing.append(release)
                continue
            original, validator, entry = found
            if entry.get("deprecated"):
                self.deprecated.add((f"{api_version} {kind}", release, entry.get("deprecationWarning", "")))
            defaulted = copy.deepcopy(obj)
            apply_defaults(defaulted, original)
            for reason in schema_errors(validator, defaulted):
                by_reason.setdefault(reason, []).append(release)
        reasons = []
        if len(missing) == len(self.releases):
            reasons.append(f"no schema for {api_version} {kind} in the {self.title} CRDs")
        elif missing:
            reasons.append(f"{api_version} {kind} is not served by {self.title} {', '.join(missing)}")
        reasons += [f"{r} ({self.title} {', '.join(v)})" for r, v in by_reason.items()]
        return reasons, self.label()


# ---------------------------------------------------------------------------------------------------------------
# The API server's name rules (apimachinery validation), which the OpenAPI schemas cannot express.

kDns1123Label = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
kDns1035Label = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
kDns1123Subdomain = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
kLabelNameKinds = {"Namespace"}
kDns1035NameKinds = {"Service"}


def name_errors(obj):
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    errors = []
    name = meta.get("name")
    if not isinstance(name, str) or name == "":
        errors.append("metadata.name is required")
    elif obj.get("kind") in kLabelNameKinds:
        if not kDns1123Label.fullmatch(name) or len(name) > 63:
            errors.append(f"metadata.name '{name}' is not a DNS-1123 label (lower case alphanumerics and '-', "
                          "at most 63)")
    elif obj.get("kind") in kDns1035NameKinds:
        if not kDns1035Label.fullmatch(name) or len(name) > 63:
            errors.append(f"metadata.name '{name}' is not a DNS-1035 label (starts with a letter, at most 63)")
    elif not kDns1123Subdomain.fullmatch(name) or len(name) > 253:
        errors.append(f"metadata.name '{name}' is not a DNS-1123 subdomain")
    namespace = meta.get("namespace")
    if namespace is not None:
        text = namespace if isinstance(namespace, str) else json.dumps(namespace)
        if not kDns1123Label.fullmatch(text) or len(text) > 63:
            errors.append(f"metadata.namespace '{text}' is not a DNS-1123 label")
    return errors


# ---------------------------------------------------------------------------------------------------------------

def check(obj, kubernetes, crd_sources):
    """(verdict "ok" | "invalid" | "skip", reasons, schema source name or None, schema label)"""
    if not isinstance(obj, dict):
        return "invalid", ["not a mapping: apiVersion and kind are required"], None, ""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if api_version is None and kind is None and isinstance(obj.get("groups"), list):
        return "skip", ["a Prometheus rules file, not a Kubernetes object (promtool checks it)"], None, ""
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return "invalid", ["apiVersion and kind are required"], None, ""
    group = api_version.rpartition("/")[0]
    if kind == "Kustomization" and group == "kustomize.config.k8s.io":
        return "skip", ["a kustomize file, not a Kubernetes API object"], None, ""
    source = next((s for s in crd_sources if group in s.groups), None)
    if source is not None:
        reasons, label = source.check(obj)
        name = source.name
    else:
        reasons, label = kubernetes.check(obj)
        name = "kubernetes"
    reasons += name_errors(obj)
    return ("invalid" if reasons else "ok"), reasons, name, label


def yaml_files(path):
    """A file as it is; a folder as the *.yaml and *.yml files under it, sorted."""
    if not os.path.isdir(path):
        return [path]
    found = []
    for folder, _, files in os.walk(path):
        found += [os.path.relpath(os.path.join(folder, f), path) for f in files if re.search(r"\.ya?ml$", f)]
    return [os.path.join(path, f) for f in sorted(found) if os.path.isfile(os.path.join(path, f))]


def policy_files(path, tmp):
    """A policy file as it is, or the *.yaml entries of the ConfigMap it holds (how deploy/ ships quotad's
    policy), written to tmp."""
    text = Path(path).read_text()
    configmap = next((o for o in documents(text, path) if isinstance(o, dict) and o.get("kind") == "ConfigMap"),
                     None)
    if configmap is None:
        return [path]
    files = []
    for key, value in (configmap.get("data") or {}).items():
        if key.endswith(".yaml"):
            files.append(os.path.join(tmp, key))
            Path(files[-1]).write_text(value)
    if not files:
        raise SystemExit(f"FAIL {path}: the ConfigMap holds no *.yaml policy")
    return files


def describe(obj):
    obj = obj if isinstance(obj, dict) else {}
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj.get('apiVersion', '?')} {obj.get('kind', '?')} {where}{meta.get('name', '(no name)')}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--crds", default=str(Path(__file__).resolve().parents[3].parent / "shared" / "crds"))
    parser.add_argument("--require", default="", help="comma-separated schema sources")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--render", nargs=2, metavar=("QUOTAD", "POLICY"))
    mode.add_argument("--expect-invalid", action="store_true")
    parser.add_argument("paths", nargs="*", metavar="FILE|FOLDER")
    args = parser.parse_args()
    if args.render and args.paths:
        parser.error("usage: --render QUOTAD POLICY")

    crds = Path(args.crds)
    missing = [name for name in kCrdSources if not (crds / name).is_dir()]
    if missing:
        print(f"SKIP: no CRD schemas at {crds / missing[0]} (the shared/ folder beside the repository holds "
              "crds/; pass --crds DIR)")
        return kSkip
    kubernetes = Kubernetes()
    crd_sources = [CrdSource(crds / name, title, oldest, kubernetes.definitions_registry())
                   for name, (title, oldest) in kCrdSources.items()]
    for source in crd_sources:
        if not source.releases:
            print(f"FAIL no {source.title} CRDs under {crds / source.name}")
            return 1
    print(f"schemas: Kubernetes {' and '.join(kKubernetesVersions)} (kubernetes-validate "
          f"{kubernetes_validate_version}, strict); " +
          "; ".join(f"{s.label()} (CRDs of {crds / s.name})" for s in crd_sources))

    sources = []  # (source, text)
    with tempfile.TemporaryDirectory(prefix="yolo8-policy-") as tmp:
        if args.render:
            quotad, policy = args.render
            for file in policy_files(policy, tmp):
                its = policy if file == policy else f"{policy} (its {os.path.basename(file)})"
                source = f"{quotad} render-k8s --policy {its}"
                try:
                    result = subprocess.run([quotad, "render-k8s", "--policy", file], capture_output=True,
                                            text=True, check=False)
                except OSError as err:
                    print(f"FAIL {source}: {err}")
                    return 1
                if result.returncode != 0:
                    print(f"FAIL {source}: {result.stderr.strip() or f'exit {result.returncode}'}")
                    return 1
                sources.append((source, result.stdout))
        else:
            for file in [f for p in args.paths for f in yaml_files(p)]:
                sources.append((file, Path(file).read_text()))
    if not sources:
        print("no input", file=sys.stderr)
        return 1

    passed = failed = 0
    counts = {"kubernetes": 0, **{s.name: 0 for s in crd_sources}}
    skipped = 0
    for source, text in sources:
        try:
            objects = documents(text, source)
        except ValueError as err:
            print(f"FAIL {err}")
            failed += 1
            continue
        if not objects:
            print(f"FAIL {source}: no object")
            failed += 1
        for obj in objects:
            verdict, reasons, schema_source, schema_label = check(obj, kubernetes, crd_sources)
            label = f"{source}: {describe(obj)}"
            if args.expect_invalid:
                annotations = ((obj.get("metadata") or {}).get("annotations") or {}) if isinstance(obj, dict) \
                    else {}
                expected = annotations.get(kExpectedErrorAnnotation) if isinstance(annotations, dict) else None
                matched = verdict == "invalid" and isinstance(expected, str) and any(expected in r for r in reasons)
                print(f"{'rejected' if matched else 'FAIL'} {label}: {'; '.join(reasons) or 'accepted'}" +
                      ("" if matched else f" (expected an error containing '{expected}')"))
                if matched:
                    passed += 1
                    if schema_source is not None:
                        counts[schema_source] += 1
                else:
                    failed += 1
                continue
            if verdict == "skip":
                print(f"skip {label}: {'; '.join(reasons)}")
                skipped += 1
                continue
            print(f"{'ok  ' if verdict == 'ok' else 'FAIL'} {label}" +
                  (f": {'; '.join(reasons)}" if reasons else f" [{schema_label}]"))
            if verdict == "ok":
                passed += 1
            else:
                failed += 1
            if schema_source is not None:
                counts[schema_source] += 1

    for source in crd_sources:
        for what, release, warning in sorted(source.deprecated):
            print(f"note: {what} is deprecated in {source.title} {release}: {warning}")
    for rule in sorted(unevaluated_rules):
        print(f"note: x-kubernetes-validations rule not evaluated (not in validate.py's kCelRules): {rule}")
    verb = "rejected" if args.expect_invalid else "checked"
    print(f"objects {verb} per schema source: " + ", ".join(f"{k} {v}" for k, v in counts.items()) +
          (f" (skipped: {skipped})" if skipped else ""))
    for name in filter(None, args.require.split(",")):
        if name not in counts:
            print(f"FAIL --require {name}: no such schema source (one of {', '.join(counts)})")
            failed += 1
        elif counts[name] == 0:
            print(f"FAIL no object was {verb} against the {name} schemas")
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
