// Validates Kubernetes objects against the official schemas (the OpenAPI of Kubernetes, compiled by the npm
// package kubernetes-models) and prints a verdict per object.
//
//   node validate.mjs FILE|FOLDER...                   every object of every (*.yaml under a) file must be valid
//   node validate.mjs --render QUOTAD POLICY           the same for what `QUOTAD render-k8s --policy POLICY` prints
//   node validate.mjs --expect-invalid FILE...         every object must be rejected, with the error its
//                                                      annotation yolo8.io/expected-error names
// Exit: 0 as expected, 1 otherwise, 77 (CTest skip) when the packages of package.json are not installed.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

const kSkip = 77;
const kExpectedErrorAnnotation = "yolo8.io/expected-error";
// Kueue's CRD schemas ship in no published npm package nor Debian package (deploy/README.md "Schema
// validation"): listed, not validated. Once @kubernetes-models/kueue is published (and runs on our node), pin it
// and move this group to kCrdPackages below.
const kNoSchemaGroups = new Map([["kueue.x-k8s.io",
                                  "no published npm or Debian package ships Kueue's CRD schemas"]]);

let YAML;
try {
  YAML = await import("yaml");
  await import("kubernetes-models/v1");
  await import("@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1");
} catch (err) {
  console.log(`SKIP: the validator's npm packages are not installed (${err.code ?? err.message}); ` +
              "run scripts/setup.sh (npm ci --ignore-scripts in tests/deploy/k8s-schema)");
  process.exit(kSkip);
}

// The API server's name rules (apimachinery validation), which the OpenAPI schemas cannot express.
const kDns1123Label = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const kDns1035Label = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const kDns1123Subdomain = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const kLabelNameKinds = new Set(["Namespace"]);
const kDns1035NameKinds = new Set(["Service"]);

function name_errors(obj) {
  const meta = obj.metadata ?? {};
  const errors = [];
  const name = meta.name;
  if (typeof name !== "string" || name === "") {
    errors.push("metadata.name is required");
  } else if (kLabelNameKinds.has(obj.kind)) {
    if (!kDns1123Label.test(name) || name.length > 63) {
      errors.push(`metadata.name '${name}' is not a DNS-1123 label (lower case alphanumerics and '-', at most 63)`);
    }
  } else if (kDns1035NameKinds.has(obj.kind)) {
    if (!kDns1035Label.test(name) || name.length > 63) {
      errors.push(`metadata.name '${name}' is not a DNS-1035 label (starts with a letter, at most 63)`);
    }
  } else if (!kDns1123Subdomain.test(name) || name.length > 253) {
    errors.push(`metadata.name '${name}' is not a DNS-1123 subdomain`);
  }
  if (meta.namespace !== undefined && (!kDns1123Label.test(String(meta.namespace)) || meta.namespace.length > 63)) {
    errors.push(`metadata.namespace '${meta.namespace}' is not a DNS-1123 label`);
  }
  return errors;
}

// CRDs whose schemas an npm package of package.json ships: API group -> package.
const kCrdPackages = new Map([["monitoring.coreos.com", "@kubernetes-models/prometheus-operator"]]);

// "apps/v1" -> kubernetes-models/apps/v1, "v1" -> kubernetes-models/v1,
// "monitoring.coreos.com/v1" -> @kubernetes-models/prometheus-operator/monitoring.coreos.com/v1.
async function model_of(api_version, kind) {
  const group = api_version.includes("/") ? api_version.split("/")[0] : "";
  const root = kCrdPackages.get(group) ?? "kubernetes-models";
  let module;
  try {
    module = await import(`${root}/${api_version}`);
  } catch {
    return null;
  }
  const model = module[kind];
  return model && model.kind === kind && model.apiVersion === api_version ? model : null;
}

// {verdict: "ok" | "invalid" | "skip", reasons: [...]}
async function check(obj) {
  const { apiVersion: api_version, kind } = obj;
  if (api_version === undefined && kind === undefined && Array.isArray(obj.groups)) {
    return { verdict: "skip", reasons: ["a Prometheus rules file, not a Kubernetes object (promtool checks it)"] };
  }
  if (typeof api_version !== "string" || typeof kind !== "string") {
    return { verdict: "invalid", reasons: ["apiVersion and kind are required"] };
  }
  const group = api_version.includes("/") ? api_version.split("/")[0] : "";
  if (kind === "Kustomization" && group === "kustomize.config.k8s.io") {
    return { verdict: "skip", reasons: ["a kustomize file, not a Kubernetes API object"] };
  }
  if (kNoSchemaGroups.has(group)) return { verdict: "skip", reasons: [kNoSchemaGroups.get(group)] };
  const model = await model_of(api_version, kind);
  if (model === null) return { verdict: "invalid", reasons: [`no official schema for ${api_version} ${kind}`] };
  const reasons = [];
  try {
    new model(obj).validate();
  } catch (err) {
    const details = err.errors ?? [];
    if (details.length === 0) reasons.push(err.message);
    for (const e of details) reasons.push(`${e.instancePath || "/"} ${e.message}`);
  }
  reasons.push(...name_errors(obj));
  return { verdict: reasons.length ? "invalid" : "ok", reasons };
}

function documents(text, source) {
  const objects = [];
  // YAML 1.1 as Kubernetes reads it (go-yaml): an unquoted yes/no/on/off is a boolean there, not a string.
  for (const doc of YAML.parseAllDocuments(text, { version: "1.1" })) {
    if (doc.errors.length) throw new Error(`${source}: YAML: ${doc.errors[0].message}`);
    const obj = doc.toJS();
    if (obj !== null && obj !== undefined) objects.push(obj);
  }
  return objects;
}

// A file as it is; a folder as the *.yaml and *.yml files under it, sorted.
function yaml_files(path) {
  if (!statSync(path).isDirectory()) return [path];
  return readdirSync(path, { recursive: true })
    .filter((f) => /\.ya?ml$/.test(f) && statSync(join(path, f)).isFile())
    .sort()
    .map((f) => join(path, f));
}

// A policy file as it is, or the *.yaml entries of the ConfigMap it holds (how deploy/ ships quotad's policy).
function policy_files(path) {
  const text = readFileSync(path, "utf8");
  const configmap = documents(text, path).find((o) => o.kind === "ConfigMap");
  if (configmap === undefined) return [path];
  const dir = mkdtempSync(join(tmpdir(), "yolo8-policy-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  const files = [];
  for (const [key, value] of Object.entries(configmap.data ?? {})) {
    if (!key.endsWith(".yaml")) continue;
    files.push(join(dir, key));
    writeFileSync(files.at(-1), value);
  }
  if (files.length === 0) throw new Error(`${path}: the ConfigMap holds no *.yaml policy`);
  return files;
}

function describe(obj) {
  const meta = obj?.metadata ?? {};
  const where = meta.namespace ? `${meta.namespace}/` : "";
  return `${obj?.apiVersion ?? "?"} ${obj?.kind ?? "?"} ${where}${meta.name ?? "(no name)"}`;
}

const args = process.argv.slice(2);
const expect_invalid = args[0] === "--expect-invalid";
const sources = [];  // {source, text}
if (args[0] === "--render") {
  if (args.length !== 3) throw new Error("usage: --render QUOTAD POLICY");
  const [, quotad, policy] = args;
  for (const file of policy_files(policy)) {
    const source = `${quotad} render-k8s --policy ${file === policy ? policy : `${policy} (its ${basename(file)})`}`;
    try {
      sources.push({ source, text: execFileSync(quotad, ["render-k8s", "--policy", file],
                                                { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }) });
    } catch (err) {
      console.log(`FAIL ${source}: ${err.stderr?.trim() || err.message}`);
      process.exit(1);
    }
  }
} else {
  for (const file of args.slice(expect_invalid ? 1 : 0).flatMap(yaml_files)) {
    sources.push({ source: file, text: readFileSync(file, "utf8") });
  }
}
if (sources.length === 0) {
  console.error("no input");
  process.exit(1);
}

let passed = 0, failed = 0;
for (const { source, text } of sources) {
  let objects;
  try {
    objects = documents(text, source);
  } catch (err) {
    console.log(`FAIL ${err.message}`);
    ++failed;
    continue;
  }
  if (objects.length === 0) {
    console.log(`FAIL ${source}: no object`);
    ++failed;
  }
  for (const obj of objects) {
    const { verdict, reasons } = await check(obj);
    const label = `${source}: ${describe(obj)}`;
    if (expect_invalid) {
      const expected = obj?.metadata?.annotations?.[kExpectedErrorAnnotation];
      const matched = verdict === "invalid" && typeof expected === "string" &&
                      reasons.some((r) => r.includes(expected));
      console.log(`${matched ? "rejected" : "FAIL"} ${label}: ${reasons.join("; ") || "accepted"}` +
                  (matched ? "" : ` (expected an error containing '${expected}')`));
      matched ? ++passed : ++failed;
      continue;
    }
    if (verdict === "skip") {
      console.log(`skip ${label}: ${reasons.join("; ")}`);
      continue;
    }
    console.log(`${verdict === "ok" ? "ok  " : "FAIL"} ${label}${reasons.length ? ": " + reasons.join("; ") : ""}`);
    verdict === "ok" ? ++passed : ++failed;
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed || passed === 0 ? 1 : 0);
