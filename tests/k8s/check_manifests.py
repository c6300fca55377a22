#!/usr/bin/env python3
"""Checks deploy/k8s/ as far as a machine without a cluster can.

Every manifest must parse; every object must be a kind this file knows, with the
fields its API requires; the objects must agree with each other (selectors and
labels, Service target ports and container ports, volumes and mounts, Secret
and claim names and keys, the StatefulSet's governing Service); and every flag
a container passes to keeld or keel-worker must be one that binary's --help
documents (the real binaries, built by Bazel).

  check_manifests.py DEPLOY_K8S_DIR KEELD KEEL_WORKER
Exits 1 listing every problem, "file: kind/name: field: what".
"""
import glob
import os
import re
import subprocess
import sys

import yaml

API = {  # kind -> apiVersion
    "Namespace": "v1", "Secret": "v1", "Service": "v1", "ConfigMap": "v1",
    "PersistentVolumeClaim": "v1", "StatefulSet": "apps/v1", "Deployment": "apps/v1",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
ACCESS_MODES = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
NAMESPACE = "keel"

problems = []


def problem(where, field, what):
    problems.append(f"{where}: {field}: {what}")


def get(obj, path, default=None):
    for key in path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return default
        obj = obj[key]
    return obj


def require(obj, where, path, kind=None):
    v = get(obj, path)
    if v is None:
        problem(where, path, "missing (required)")
    elif kind is not None and not isinstance(v, kind):
        problem(where, path, f"expected {kind.__name__ if isinstance(kind, type) else kind}, got {type(v).__name__}")
    return v


def check_quantities(where, resources, field):
    for section in ("requests", "limits"):
        for name, q in (resources or {}).get(section, {}).items():
            if not QUANTITY.match(str(q)):
                problem(where, f"{field}.{section}.{name}", f"{q!r} is not a Kubernetes quantity")


def help_flags(binary):
    p = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", p.stdout + p.stderr))


def check_pod_template(where, spec, objects, claim_templates=()):
    template = require(spec, where, "template", dict) or {}
    labels = get(template, "metadata.labels", {}) or {}
    match = require(spec, where, "selector.matchLabels", dict) or {}
    for k, v in match.items():
        if labels.get(k) != v:
            problem(where, "spec.selector.matchLabels", f"{k}={v} is not a label of the pod template (a workload "
                                                       "whose selector does not match its pods is refused)")
    pod = require(template, where, "spec", dict) or {}
    containers = require(pod, where, "containers", list) or []
    if not containers:
        problem(where, "spec.template.spec.containers", "empty (at least one container is required)")
    volumes = {v.get("name"): v for v in pod.get("volumes", []) or []}
    for name in list(volumes) + list(claim_templates):
        if not name or not DNS_LABEL.match(name):
            problem(where, "volumes[].name", f"{name!r} is not a DNS label")
    for v in volumes.values():
        if "secret" in v:
            sname = get(v, "secret.secretName")
            secret = objects.get(("Secret", sname))
            if secret is None:
                problem(where, f"volumes.{v['name']}.secret.secretName", f"no Secret named {sname!r} in deploy/k8s")
            else:
                keys = set((secret.get("stringData") or {}).keys()) | set((secret.get("data") or {}).keys())
                for item in get(v, "secret.items", []) or []:
                    if item.get("key") not in keys:
                        problem(where, f"volumes.{v['name']}.secret.items", f"key {item.get('key')!r} is not in Secret "
                                                                           f"{sname} (keys: {sorted(keys)})")
        if "persistentVolumeClaim" in v:
            cname = get(v, "persistentVolumeClaim.claimName")
            if ("PersistentVolumeClaim", cname) not in objects:
                problem(where, f"volumes.{v['name']}.persistentVolumeClaim.claimName",
                        f"no PersistentVolumeClaim named {cname!r} in deploy/k8s")
    ports = set()
    for i, c in enumerate(containers):
        cw = f"{where}: container {c.get('name', i)}"
        name = require(c, cw, "name", str)
        if name and not DNS_LABEL.match(name):
            problem(cw, "name", f"{name!r} is not a DNS label")
        require(c, cw, "image", str)
        for p in c.get("ports", []) or []:
            port = p.get("containerPort")
            if not isinstance(port, int) or not 1 <= port <= 65535:
                problem(cw, "ports[].containerPort", f"{port!r} (allowed: an integer 1..65535)")
            if "name" in p:
                if len(p["name"]) > 15 or not DNS_LABEL.match(p["name"]):
                    problem(cw, "ports[].name", f"{p['name']!r} (allowed: a DNS label of at most 15 characters)")
                ports.add(p["name"])
            ports.add(port)
        for m in c.get("volumeMounts", []) or []:
            if m.get("name") not in volumes and m.get("name") not in claim_templates:
                problem(cw, "volumeMounts", f"{m.get('name')!r} is neither a volume nor a volumeClaimTemplate")
            if not str(m.get("mountPath", "")).startswith("/"):
                problem(cw, "volumeMounts.mountPath", f"{m.get('mountPath')!r} is not an absolute path")
        check_quantities(cw, c.get("resources"), "resources")
        for probe in ("readinessProbe", "livenessProbe"):
            port = get(c, f"{probe}.tcpSocket.port")
            if port is not None and port not in ports:
                problem(cw, f"{probe}.tcpSocket.port", f"{port!r} is not a port of this container")
    return labels, containers, ports


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    root, keeld, worker = sys.argv[1:]
    flags = {"keeld": help_flags(keeld), "keel-worker": help_flags(worker)}
    for b, f in flags.items():
        if "--help" not in f and len(f) < 5:
            sys.exit(f"check_manifests: {b} --help printed no flags")
    files = sorted(glob.glob(os.path.join(root, "*.yaml")))
    if not files:
        sys.exit(f"check_manifests: no *.yaml under {root}")
    objects = {}
    docs = []
    for path in files:
        base = os.path.basename(path)
        try:
            loaded = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        except yaml.YAMLError as e:
            problem(base, "-", f"does not parse: {e}")
            continue
        for d in loaded:
            if not isinstance(d, dict):
                problem(base, "-", "a document that is not a mapping")
                continue
            kind, name = d.get("kind"), get(d, "metadata.name")
            where = f"{base}: {kind}/{name}"
            if kind not in API:
                problem(where, "kind", f"{kind!r} (allowed here: {', '.join(sorted(API))})")
                continue
            if d.get("apiVersion") != API[kind]:
                problem(where, "apiVersion", f"{d.get('apiVersion')!r} (allowed for {kind}: {API[kind]})")
            if not isinstance(name, str) or not DNS_LABEL.match(name) or len(name) > 63:
                problem(where, "metadata.name", f"{name!r} (allowed: a DNS label of at most 63 characters)")
            if kind != "Namespace" and get(d, "metadata.namespace") != NAMESPACE:
                problem(where, "metadata.namespace", f"{get(d, 'metadata.namespace')!r} (allowed: {NAMESPACE})")
            if (kind, name) in objects:
                problem(where, "metadata.name", "defined twice")
            objects[(kind, name)] = d
            docs.append((where, d))
    if ("Namespace", NAMESPACE) not in objects:
        problem("deploy/k8s", "Namespace", f"no Namespace {NAMESPACE}")
    workloads = []
    for where, d in docs:
        kind = d["kind"]
        spec = d.get("spec") or {}
        if kind == "Secret":
            if not (d.get("stringData") or d.get("data")):
                problem(where, "stringData", "a Secret without keys")
        elif kind == "ConfigMap":
            for key, text in (d.get("data") or {}).items():
                if not isinstance(text, str):
                    problem(where, f"data.{key}", "ConfigMap values must be strings")
                elif key.endswith((".yml", ".yaml")):
                    try:
                        cfg = yaml.safe_load(text)
                    except yaml.YAMLError as e:
                        problem(where, f"data.{key}", f"does not parse: {e}")
                        continue
                    if key == "prometheus.yml":
                        jobs = {j.get("job_name") for j in cfg.get("scrape_configs", [])}
                        for want in ("keeld", "keel-worker"):
                            if want not in jobs:
                                problem(where, f"data.{key}.scrape_configs", f"no job {want!r} (jobs: {sorted(jobs)})")
        elif kind == "PersistentVolumeClaim":
            modes = require(spec, where, "accessModes", list) or []
            for m in modes:
                if m not in ACCESS_MODES:
                    problem(where, "spec.accessModes", f"{m!r} (allowed: {', '.join(sorted(ACCESS_MODES))})")
            q = require(spec, where, "resources.requests.storage")
            if q is not None and not QUANTITY.match(str(q)):
                problem(where, "spec.resources.requests.storage", f"{q!r} is not a quantity")
        elif kind in ("StatefulSet", "Deployment"):
            claims = []
            if kind == "StatefulSet":
                svc = require(spec, where, "serviceName", str)
                s = objects.get(("Service", svc))
                if s is None:
                    problem(where, "spec.serviceName", f"no Service named {svc!r}")
                elif get(s, "spec.clusterIP") != "None":
                    problem(where, "spec.serviceName", f"Service {svc} is not headless (clusterIP: None)")
                for t in spec.get("volumeClaimTemplates", []) or []:
                    claims.append(get(t, "metadata.name"))
                    for m in get(t, "spec.accessModes", []) or []:
                        if m not in ACCESS_MODES:
                            problem(where, "volumeClaimTemplates.spec.accessModes", f"{m!r}")
                    if not QUANTITY.match(str(get(t, "spec.resources.requests.storage", ""))):
                        problem(where, "volumeClaimTemplates.spec.resources.requests.storage", "missing or not a quantity")
            labels, containers, ports = check_pod_template(where, spec, objects, claims)
            workloads.append((where, d, labels, ports))
            for c in containers:
                cmd = (c.get("command") or [""])[0]
                binary = os.path.basename(cmd)
                if binary in flags:
                    for a in c.get("args", []) or []:
                        flag = str(a).split("=", 1)[0]
                        if flag.startswith("--") and flag not in flags[binary]:
                            problem(where, f"container {c.get('name')}.args", f"{flag} is not a flag of {binary} "
                                                                            f"(its --help lists {len(flags[binary])})")
                if binary == "keel-worker":
                    gpus = get(c, "resources.limits", {}).get("nvidia.com/gpu")
                    if not isinstance(gpus, int) or gpus < 1:
                        problem(where, "resources.limits.nvidia.com/gpu", f"{gpus!r} (a GPU worker requests >= 1)")
    for where, d in docs:
        if d["kind"] != "Service":
            continue
        sel = require(d, where, "spec.selector", dict) or {}
        ports = require(d, where, "spec.ports", list) or []
        matched = [w for w in workloads if all(w[2].get(k) == v for k, v in sel.items())]
        if not matched:
            problem(where, "spec.selector", f"{sel} selects no workload's pods")
        for p in ports:
            port = p.get("port")
            if not isinstance(port, int) or not 1 <= port <= 65535:
                problem(where, "spec.ports[].port", f"{port!r} (allowed: an integer 1..65535)")
            target = p.get("targetPort", port)
            for w in matched:
                if target not in w[3]:
                    problem(where, "spec.ports[].targetPort", f"{target!r} is not a container port of {w[0]}")
    kinds = sorted({d["kind"] for _, d in docs})
    if problems:
        print("\n".join(problems))
        print(f"check_manifests: {len(problems)} problem(s) in {len(files)} files")
        sys.exit(1)
    print(f"check_manifests: {len(docs)} objects in {len(files)} files OK ({', '.join(kinds)})")


if __name__ == "__main__":
    main()
