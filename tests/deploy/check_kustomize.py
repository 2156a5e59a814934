#!/usr/bin/env python3
"""Renders deploy/kubernetes (base and overlays/gpu) with `kubectl kustomize` and
checks that the rendered objects refer to each other correctly: selectors and labels,
Service target ports, probe ports, volumes and mounts, ConfigMaps, Secrets and
claims, $(VAR)s in args, the flags' ports and files, security contexts, resources,
and what the GPU overlay adds.

Usage: check_kustomize.py SOURCE_DIR. Exits 77 (skipped) when no kubectl is found.
"""
import os
import re
import shutil
import subprocess
import sys

import yaml

# Secrets the operator creates (docs/deploy.md says how); nothing secret is rendered.
EXTERNAL_SECRETS = {"ddp-coordinator-tls", "ddp-auth-tokens", "ddp-worker-tls"}


class Checker:
    def __init__(self, name, objects):
        self.name = name
        self.objects = objects
        self.failures = []
        self.checks = 0

    def expect(self, ok, message):
        self.checks += 1
        if not ok:
            self.failures.append("%s: %s" % (self.name, message))
        return ok

    def of_kind(self, kind):
        return [o for o in self.objects if o["kind"] == kind]

    def named(self, kind, name):
        return next((o for o in self.of_kind(kind) if o["metadata"]["name"] == name), None)


def workloads(c):
    return c.of_kind("StatefulSet") + c.of_kind("DaemonSet") + c.of_kind("Deployment")


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def flag(args, name):
    for a in args:
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
    return None


def port_of(hostport):
    return int(hostport.rsplit(":", 1)[1])


def check_workload(c, w, all_docs):
    kind, name = w["kind"], w["metadata"]["name"]
    where = "%s/%s" % (kind, name)
    spec = w["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    c.expect(matches(spec["selector"]["matchLabels"], labels),
             "%s: selector %s does not match its pod labels %s" % (where, spec["selector"], labels))
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    mounted = set()
    configmaps = {o["metadata"]["name"]: o for o in c.of_kind("ConfigMap")}
    pod_sc = pod.get("securityContext", {})
    c.expect(pod_sc.get("runAsNonRoot") is True, "%s: pods do not run as non-root" % where)
    c.expect(pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
             "%s: no RuntimeDefault seccomp profile" % where)
    for ctr in pod["containers"]:
        cw = "%s container %s" % (where, ctr["name"])
        ports = {p["containerPort"] for p in ctr.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            p = ctr.get(probe)
            if not c.expect(p is not None, "%s has no %s" % (cw, probe)):
                continue
            c.expect("grpc" in p, "%s: %s is not a gRPC probe" % (cw, probe))
            port = (p.get("grpc") or p.get("tcpSocket") or p.get("httpGet") or {}).get("port")
            c.expect(port in ports, "%s: %s probes port %s, not a container port %s"
                     % (cw, probe, port, sorted(ports)))
        sc = ctr.get("securityContext", {})
        c.expect(sc.get("allowPrivilegeEscalation") is False, "%s allows privilege escalation" % cw)
        c.expect(not sc.get("privileged"), "%s is privileged" % cw)
        c.expect(sc.get("capabilities", {}).get("drop") == ["ALL"], "%s keeps capabilities" % cw)
        res = ctr.get("resources", {})
        for key in ("cpu", "memory"):
            c.expect(key in res.get("requests", {}), "%s requests no %s" % (cw, key))
        c.expect("memory" in res.get("limits", {}), "%s has no memory limit" % cw)
        mount_paths = {}
        for m in ctr.get("volumeMounts", []):
            mounted.add(m["name"])
            mount_paths[m["mountPath"]] = m["name"]
            c.expect(m["name"] in volumes or m["name"] in claims,
                     "%s mounts %s, which is neither a volume nor a claim template" % (cw, m["name"]))
        # $(VAR) in command and args: defined by env or by a ConfigMap in envFrom.
        defined = {e["name"] for e in ctr.get("env", [])}
        for ef in ctr.get("envFrom", []):
            ref = ef.get("configMapRef", {}).get("name")
            if ref is not None:
                if c.expect(ref in configmaps, "%s: envFrom ConfigMap %s is not rendered" % (cw, ref)):
                    defined |= set(configmaps[ref].get("data", {}))
        for e in ctr.get("env", []):
            ref = e.get("valueFrom", {}).get("configMapKeyRef")
            if ref:
                c.expect(ref["name"] in configmaps and ref["key"] in configmaps[ref["name"]].get("data", {}),
                         "%s: env %s refers to a missing ConfigMap key" % (cw, e["name"]))
        args = ctr.get("args", [])
        for a in ctr.get("command", []) + args:
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                c.expect(var in defined, "%s: %s uses $(%s), which nothing defines" % (cw, a, var))
        # Files named by flags lie in a mounted volume.
        for f in ("tls-cert", "tls-key", "tls-ca", "auth-token-file"):
            path = flag(args, f)
            if path is not None:
                vol = next((v for p, v in mount_paths.items() if path.startswith(p.rstrip("/") + "/")), None)
                c.expect(vol is not None, "%s: --%s=%s is in no mounted volume" % (cw, f, path))
                if vol is not None and "secret" in volumes.get(vol, {}):
                    c.expect(True, "")
        # The ports the daemon listens on are container ports, and probed.
        for f in ("listen", "health-listen", "metrics-listen"):
            value = flag(args, f)
            if value is not None:
                c.expect(port_of(value) in ports, "%s: --%s=%s is not a container port" % (cw, f, value))
        health = flag(args, "health-listen")
        if health is not None:
            for probe in ("readinessProbe", "livenessProbe"):
                c.expect(ctr.get(probe, {}).get("grpc", {}).get("port") == port_of(health),
                         "%s: %s does not probe --health-listen's port %s" % (cw, probe, health))
    for vname, v in volumes.items():
        c.expect(vname in mounted, "%s: volume %s is never mounted" % (where, vname))
        if "secret" in v:
            s = v["secret"]["secretName"]
            c.expect(s in EXTERNAL_SECRETS or c.named("Secret", s) is not None,
                     "%s: Secret %s is neither rendered nor one the docs tell operators to create" % (where, s))
        if "configMap" in v:
            c.expect(v["configMap"]["name"] in configmaps, "%s: ConfigMap %s is not rendered" % (where, v["configMap"]["name"]))
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            c.expect(c.named("PersistentVolumeClaim", claim) is not None, "%s: claim %s is not rendered" % (where, claim))
    return labels


def check(name, docs, gpu):
    c = Checker(name, docs)
    ns = {o["metadata"].get("namespace") for o in docs if o["kind"] != "Namespace"}
    c.expect(len(ns) == 1 and None not in ns, "objects are not all in one namespace: %s" % ns)
    pods = {}
    for w in workloads(c):
        pods[(w["kind"], w["metadata"]["name"])] = (w, check_workload(c, w, docs))
    sts = c.named("StatefulSet", "ddp-coordinator")
    ds = c.named("DaemonSet", "ddp-worker")
    if not (c.expect(sts is not None, "no coordinator StatefulSet") and c.expect(ds is not None, "no worker DaemonSet")):
        return c
    # Services select a workload's pods and target its ports.
    for svc in c.of_kind("Service"):
        sel = svc["spec"].get("selector", {})
        target = [w for w, labels in pods.values() if matches(sel, labels)]
        if not c.expect(target, "Service %s selects no pods" % svc["metadata"]["name"]):
            continue
        ctrs = target[0]["spec"]["template"]["spec"]["containers"]
        named = {p.get("name"): p["containerPort"] for ct in ctrs for p in ct.get("ports", [])}
        for p in svc["spec"]["ports"]:
            t = p.get("targetPort", p["port"])
            c.expect(t in named if isinstance(t, str) else t in named.values(),
                     "Service %s targets port %s, which its pods do not have" % (svc["metadata"]["name"], t))
    headless = c.named("Service", sts["spec"]["serviceName"])
    c.expect(headless is not None and headless["spec"].get("clusterIP") == "None",
             "the StatefulSet's serviceName %s is not a headless Service" % sts["spec"]["serviceName"])
    c.expect(any(t["spec"]["accessModes"] for t in sts["spec"].get("volumeClaimTemplates", [])),
             "the coordinator has no PersistentVolumeClaim for its state")
    state_dir = flag(sts["spec"]["template"]["spec"]["containers"][0]["args"], "state-dir")
    c.expect(any(m["mountPath"] == state_dir and m["name"] in {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
                 for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]),
             "--state-dir %s is not the persistent volume" % state_dir)
    # Workers: host network, the coordinator's Service by name and port, writable
    # shared storage.
    wpod = ds["spec"]["template"]["spec"]
    c.expect(wpod.get("hostNetwork") is True, "workers are not on the host network")
    c.expect(wpod.get("dnsPolicy") == "ClusterFirstWithHostNet", "workers cannot resolve Service names")
    worker = wpod["containers"][0]
    env = {}
    for ef in worker.get("envFrom", []):
        cm = c.named("ConfigMap", ef["configMapRef"]["name"])
        env.update(cm.get("data", {}) if cm else {})
    target = flag(worker["args"], "coordinator").replace("$(DDP_COORDINATOR)", env.get("DDP_COORDINATOR", ""))
    host, port = target.rsplit(":", 1)
    parts = host.split(".")
    svc = c.named("Service", parts[0])
    c.expect(svc is not None and parts[1] == svc["metadata"]["namespace"],
             "workers' --coordinator %s is not the coordinator's Service in its namespace" % target)
    if svc is not None:
        c.expect(int(port) in [p["port"] for p in svc["spec"]["ports"]],
                 "workers' --coordinator port %s is not the Service's" % port)
    shared = [m for m in worker["volumeMounts"] if not m.get("readOnly")
              and "persistentVolumeClaim" in next(v for v in wpod["volumes"] if v["name"] == m["name"])]
    c.expect(shared, "workers have no writable shared storage for checkpoints")
    # TLS and tokens from files, by issue 10's flag names.
    cargs = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    for f in ("tls-cert", "tls-key", "tls-ca", "auth-token-file"):
        c.expect(flag(cargs, f) is not None, "the coordinator lacks --%s" % f)
    for f in ("tls-cert", "tls-key", "tls-ca"):
        c.expect(flag(worker["args"], f) is not None, "workers lack --%s" % f)
    # A PodDisruptionBudget that selects the workers.
    pdbs = c.of_kind("PodDisruptionBudget")
    c.expect(any(matches(p["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"]) for p in pdbs),
             "no PodDisruptionBudget selects the workers")
    gpus = worker.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if gpu:
        c.expect(gpus is not None and int(gpus) > 0, "the GPU overlay requests no nvidia.com/gpu")
        c.expect("cuda" in worker["image"], "the GPU overlay does not run the CUDA image (%s)" % worker["image"])
    else:
        c.expect(gpus is None, "the base requests GPUs")
    return c


def main():
    src = sys.argv[1]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: no kubectl (scripts/install_deps.sh installs Debian's kubernetes-client)")
        return 77
    docs_text = open(os.path.join(src, "docs", "deploy.md")).read()
    failures, checks = [], 0
    for secret in sorted(EXTERNAL_SECRETS):
        checks += 1
        if "secret generic %s" % secret not in docs_text and "secret tls %s" % secret not in docs_text:
            failures.append("docs/deploy.md does not say how to create Secret %s" % secret)
    for name, gpu in (("base", False), ("overlays/gpu", True)):
        path = os.path.join(src, "deploy", "kubernetes", name)
        r = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
        checks += 1
        if r.returncode != 0:
            failures.append("%s: kubectl kustomize failed: %s" % (name, r.stderr.strip()))
            continue
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        c = check(name, docs, gpu)
        checks += c.checks
        failures += c.failures
        print("%s: %d objects rendered" % (name, len(docs)))
    for f in failures:
        print("FAIL:", f)
    print("%d passed, %d failed" % (checks - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
