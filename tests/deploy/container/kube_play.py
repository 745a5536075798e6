"""Turns deploy/'s manifests into what `podman kube play` (4.3) runs, changing only what a test run must change.

  kube_play.py quotad PREFIX OUT.yaml SECRETS_DIR                the quotad Deployment, its PVC, its policy ConfigMap
  kube_play.py job    PREFIX JOB.yaml QUOTAD_URL OUT.yaml SECRETS_DIR  a Job's pod template as a Pod (no Job in podman)
SECRETS_DIR/NAME/KEY holds what Secret NAME would mount as KEY.

Kept as in the manifest: image, command, args (but for the run-specific values a user edits per run, see
RUN_VALUES), env, ports, probes, volume mounts and security contexts. Changed, each for a reason:
- names get PREFIX (several tests may run at once) and namespaces go (podman has none);
- Secret volumes become hostPath folders the test fills, and secretKeyRef env values plain values: podman 4.3.1
  panics in VolumeFromSecret on any secret volume (seen here), and it has no Secret store kube play reads;
- the quota URL is the test's quotad pod instead of the cluster's Service DNS name;
- a fieldRef to spec.nodeName (which podman refuses) becomes the first node of the deployed policy's inventory: the
  kubelet fills in the node the pod runs on, and quotad places leases only on its inventory's nodes;
- $(VAR) in args is expanded from the container's env, as the kubelet does and podman 4.3 does not.
"""
import re
import sys

import yaml

# The values a user sets per run when copying the Job template (deploy/README.md, "Deploy", step 4): a tiny CPU run.
RUN_VALUES = {"model": "yolov8n.yaml", "data": "/datasets/ds/data.yaml", "epochs": "2", "imgsz": "64", "batch": "4"}


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def first_inventory_node():
    (config_map,) = load_all("deploy/k8s/quotad/configmap-policy.yaml")
    policy = yaml.safe_load(config_map["data"]["quota-policy.yaml"])
    return policy["inventory"]["nodes"][0]["name"]


def secret_volumes_to_host_paths(pod_spec, prefix, secrets_dir):
    for volume in pod_spec.get("volumes", []):
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            volume.pop("secret")
            volume["hostPath"] = {"path": f"{secrets_dir}/{name}", "type": "Directory"}
        elif "persistentVolumeClaim" in volume:
            volume["persistentVolumeClaim"]["claimName"] = prefix + "-" + volume["persistentVolumeClaim"]["claimName"]


def quotad(prefix, out, secrets_dir):
    docs = load_all("deploy/k8s/quotad/configmap-policy.yaml") + load_all("deploy/k8s/quotad/pvc.yaml")
    docs += load_all("deploy/k8s/quotad/deployment.yaml")
    for doc in docs:
        doc["metadata"].pop("namespace", None)
        if doc["kind"] in ("PersistentVolumeClaim", "ConfigMap"):  # podman makes a volume of each, by this name
            doc["metadata"]["name"] = prefix + "-" + doc["metadata"]["name"]
        if doc["kind"] == "Deployment":
            doc["metadata"]["name"] = prefix + "-quotad"
            spec = doc["spec"]["template"]["spec"]
            secret_volumes_to_host_paths(spec, prefix, secrets_dir)
            for volume in spec["volumes"]:
                if "configMap" in volume:
                    volume["configMap"]["name"] = prefix + "-" + volume["configMap"]["name"]
    with open(out, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)


def job(prefix, job_path, quotad_url, out, secrets_dir):
    (job_doc,) = [d for d in load_all(job_path) if d["kind"] == "Job"]
    template = job_doc["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": prefix + "-train", "labels": template["metadata"].get("labels", {})},
           "spec": template["spec"]}
    spec = pod["spec"]
    secret_volumes_to_host_paths(spec, prefix, secrets_dir)
    for container in spec["containers"]:
        args = []
        for arg in container.get("args", []):
            key = arg.split("=", 1)[0]
            args.append(f"{key}={RUN_VALUES[key]}" if key in RUN_VALUES else arg)
        container["args"] = args
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                env.pop("valueFrom")
                with open(f"{secrets_dir}/{ref['name']}/{ref['key']}") as f:
                    env["value"] = f.read()
            if env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                env.pop("valueFrom")
                env["value"] = first_inventory_node()
            if env["name"] == "YOLO8_QUOTA_URL":
                env["value"] = quotad_url
        values = {env["name"]: env["value"] for env in container.get("env", []) if "value" in env}
        container["args"] = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m.group(1), m.group(0)), arg)
                             for arg in container["args"]]
    with open(out, "w") as f:
        yaml.safe_dump(pod, f, sort_keys=False)


if __name__ == "__main__":
    kind, prefix = sys.argv[1], sys.argv[2]
    if kind == "quotad":
        quotad(prefix, sys.argv[3], sys.argv[4])
    else:
        job(prefix, sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])
