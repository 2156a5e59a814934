#!/usr/bin/env python3
"""Renders deploy/kubernetes (base, overlays/gpu and overlays/ha) with `kubectl
kustomize` and checks that the rendered objects refer to each other correctly:
selectors and labels, Service target ports, probe ports, volumes and mounts,
ConfigMaps, Secrets and claims, $(VAR)s in args, the flags' ports and files, security
contexts, resources, what the GPU overlay adds, and what the HA overlay (coordinators
in standby over PostgreSQL, docs/high-availability.md) changes: two replicas that
start together and are replaced by hand, --store from a Secret, no state volume, the
readiness probe that routes the Service to the leader, a PodDisruptionBudget,
anti-affinity, and workers given every coordinator pod.

Usage: check_kustomize.py SOURCE_DIR. Exits 77 (skipped) when no kubectl is found.
"""
import os
import re
import shutil
import subprocess
import sys

import yaml

# Secrets the operator creates (docs/deploy.md and docs/high-availability.md say how);
# nothing secret is rendered.
EXTERNAL_SECRETS = {"ddp-coordinator-tls", "ddp-auth-tokens", "ddp-worker-tls", "ddp-store"}
# Every directory under deploy/kubernetes rendered here: (path, GPU workers, HA coordinators).
RENDERED = (("base", False, False), ("overlays/gpu", True, False), ("overlays/ha", False, True))


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
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                c.expect(ref["name"] in EXTERNAL_SECRETS or c.named("Secret", ref["name"]) is not None,
                         "%s: env %s reads Secret %s, which is neither rendered nor one the docs "
                         "tell operators to create" % (cw, e["name"], ref["name"]))
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


def env_of(c, ctr):
    """What envFrom ConfigMaps give a container (by name)."""
    env = {}
    for ef in ctr.get("envFrom", []):
        cm = c.named("ConfigMap", ef.get("configMapRef", {}).get("name"))
        env.update(cm.get("data", {}) if cm else {})
    return env


def check(name, docs, gpu, ha):
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
    coord = sts["spec"]["template"]["spec"]["containers"][0]
    if ha:
        check_ha(c, sts, ds, headless)
    else:
        c.expect(sts["spec"].get("replicas") == 1, "more than one coordinator over SQLite")
        c.expect(any(t["spec"]["accessModes"] for t in sts["spec"].get("volumeClaimTemplates", [])),
                 "the coordinator has no PersistentVolumeClaim for its state")
        state_dir = flag(coord["args"], "state-dir")
        c.expect(any(m["mountPath"] == state_dir and m["name"] in {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
                     for m in coord["volumeMounts"]),
                 "--state-dir %s is not the persistent volume" % state_dir)
    # Workers: host network, the coordinator by name and port, writable shared storage.
    wpod = ds["spec"]["template"]["spec"]
    c.expect(wpod.get("hostNetwork") is True, "workers are not on the host network")
    c.expect(wpod.get("dnsPolicy") == "ClusterFirstWithHostNet", "workers cannot resolve Service names")
    worker = wpod["containers"][0]
    env = env_of(c, worker)
    target = flag(worker["args"], "coordinator").replace("$(DDP_COORDINATOR)", env.get("DDP_COORDINATOR", ""))
    if not ha:
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
    for f in ("tls-cert", "tls-key", "tls-ca", "auth-token-file"):
        c.expect(flag(coord["args"], f) is not None, "the coordinator lacks --%s" % f)
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
        c.expect(gpus is None, "%s requests GPUs" % name)
    return c


def check_ha(c, sts, ds, headless):
    """Coordinators in standby over PostgreSQL (docs/high-availability.md)."""
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    coord = pod["containers"][0]
    args = coord["args"]
    replicas = spec.get("replicas", 1)
    c.expect(replicas == 2, "the HA overlay runs %s coordinator replicas, not 2" % replicas)
    # A standby is never Ready: OrderedReady would hold later pods back, RollingUpdate
    # would wait forever for an updated standby.
    c.expect(spec.get("podManagementPolicy") == "Parallel",
             "coordinator pods do not start in parallel (a standby never turns Ready)")
    c.expect(spec.get("updateStrategy", {}).get("type") == "OnDelete",
             "coordinator pods are not replaced by hand (RollingUpdate waits for a standby to be Ready)")
    # The state is in PostgreSQL: no --state-dir, no volume for it.
    c.expect(flag(args, "state-dir") is None, "the HA coordinator still has --state-dir")
    c.expect(not spec.get("volumeClaimTemplates"), "the HA coordinator still claims a state volume")
    c.expect(all(m["mountPath"] != "/var/lib/ddp" for m in coord.get("volumeMounts", [])),
             "the HA coordinator still mounts /var/lib/ddp")
    # --store is $(VAR), VAR from a Secret the operator creates; no URI is rendered.
    env = {e["name"]: e for e in coord.get("env", [])}
    store = flag(args, "store") or ""
    m = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", store)
    ref = env.get(m.group(1), {}).get("valueFrom", {}).get("secretKeyRef") if m else None
    c.expect(ref is not None and ref["name"] in EXTERNAL_SECRETS and ref["key"] == "uri",
             "--store=%s is not $(VAR) with VAR from the uri key of an operator's Secret" % store)
    password = env.get("PGPASSWORD", {}).get("valueFrom", {}).get("secretKeyRef")
    c.expect(password is not None and ref is not None and password["name"] == ref["name"],
             "the coordinator does not get PGPASSWORD from the store's Secret")
    rendered = "\n".join(args + [str(e.get("value", "")) for e in env.values()])
    c.expect(not re.search(r"postgres(ql)?://", rendered),
             "a PostgreSQL URI is rendered into the coordinator's args or env")
    # What standbys name as the leader: this pod, as workers list it.
    advertise = flag(args, "advertise-addr") or ""
    for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", advertise):
        c.expect("fieldRef" in env.get(var, {}).get("valueFrom", {}),
                 "--advertise-addr uses $(%s), which is not from the downward API" % var)
    listen_port = port_of(flag(args, "listen"))
    c.expect(advertise != "" and port_of(advertise) == listen_port,
             "--advertise-addr %r is not on --listen's port %s" % (advertise, listen_port))
    # Readiness on the health port, service "": SERVING on the leader only, so the
    # client Service routes to the leader. Liveness: "liveness", SERVING on both.
    health = port_of(flag(args, "health-listen"))
    ready = coord.get("readinessProbe", {}).get("grpc", {})
    c.expect(ready.get("port") == health and ready.get("service", "") == "",
             "the readiness probe is not service \"\" on the health port %s: %s" % (health, ready))
    live = coord.get("livenessProbe", {}).get("grpc", {})
    c.expect(live.get("port") == health and live.get("service") == "liveness",
             "the liveness probe is not service \"liveness\" on the health port %s: %s" % (health, live))
    client = c.named("Service", "ddp-coordinator")
    c.expect(client is not None and matches(client["spec"]["selector"], labels)
             and not client["spec"].get("publishNotReadyAddresses"),
             "the Service ddp-coordinator does not route to Ready coordinators only")
    c.expect(headless is not None and headless["spec"].get("publishNotReadyAddresses") is True,
             "standbys' pod DNS names do not resolve (the headless Service publishes Ready pods only)")
    # A budget that keeps one coordinator, and replicas on different nodes.
    pdbs = [p for p in c.of_kind("PodDisruptionBudget") if matches(p["spec"]["selector"]["matchLabels"], labels)]
    c.expect(len(pdbs) == 1 and pdbs[0]["spec"].get("minAvailable") == 1,
             "no PodDisruptionBudget with minAvailable 1 selects the coordinators")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {})
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution", []) + [
        t.get("podAffinityTerm", {}) for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])]
    c.expect(any(t.get("topologyKey") == "kubernetes.io/hostname"
                 and matches(t.get("labelSelector", {}).get("matchLabels", {}), labels) for t in terms),
             "no anti-affinity spreads the coordinators over nodes")
    # Workers: every coordinator pod, by its DNS name through the headless Service.
    worker = ds["spec"]["template"]["spec"]["containers"][0]
    target = flag(worker["args"], "coordinator").replace("$(DDP_COORDINATOR)", env_of(c, worker).get("DDP_COORDINATOR", ""))
    ns = sts["metadata"]["namespace"]
    want = ["%s-%d.%s.%s.svc.cluster.local:%d" % (sts["metadata"]["name"], i, spec["serviceName"], ns, listen_port)
            for i in range(replicas)]
    c.expect(target.split(",") == want,
             "workers' --coordinator %s is not every coordinator pod (%s)" % (target, ",".join(want)))
    c.expect(advertise.replace("$(POD_NAME)", sts["metadata"]["name"] + "-0").replace("$(POD_NAMESPACE)", ns) == want[0],
             "--advertise-addr %s is not the pod's name in the workers' list" % advertise)


def check_example_secret(src):
    """overlays/ha/secret.example.yaml: the Secret the overlay reads, not applied, no password."""
    failures = []
    d = os.path.join(src, "deploy", "kubernetes", "overlays", "ha")
    kust = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
    listed = sum((kust.get(k) or [] for k in ("resources", "bases", "patchesStrategicMerge")), [])
    if "secret.example.yaml" in listed:
        failures.append("overlays/ha applies secret.example.yaml")
    secret = yaml.safe_load(open(os.path.join(d, "secret.example.yaml")))
    data = secret.get("stringData", {})
    if secret.get("kind") != "Secret" or secret["metadata"]["name"] != "ddp-store" or set(data) != {"uri", "password"}:
        failures.append("secret.example.yaml is not Secret ddp-store with keys uri and password")
    if data.get("password") != "CHANGE-ME" or ":" in data.get("uri", "").split("//", 1)[-1].split("@")[0]:
        failures.append("secret.example.yaml holds what looks like a real password")
    return failures


def main():
    src = sys.argv[1]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("SKIP: no kubectl (scripts/install_deps.sh installs Debian's kubernetes-client)")
        return 77
    failures, checks = [], 0
    docs_text = ""
    for f in ("deploy.md", "high-availability.md"):
        checks += 1
        try:
            docs_text += open(os.path.join(src, "docs", f)).read()
        except OSError as e:
            failures.append("docs/%s: %s" % (f, e))
    for secret in sorted(EXTERNAL_SECRETS):
        checks += 1
        if "secret generic %s" % secret not in docs_text and "secret tls %s" % secret not in docs_text:
            failures.append("docs/deploy.md and docs/high-availability.md do not say how to create Secret %s" % secret)
    overlays = os.path.join(src, "deploy", "kubernetes", "overlays")
    checks += 1
    unchecked = {"overlays/" + d for d in os.listdir(overlays)} - {name for name, _, _ in RENDERED}
    if unchecked:
        failures.append("overlays not rendered by this test: %s" % ", ".join(sorted(unchecked)))
    checks += 1
    failures += check_example_secret(src)
    for name, gpu, ha in RENDERED:
        path = os.path.join(src, "deploy", "kubernetes", name)
        r = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
        checks += 1
        if r.returncode != 0:
            failures.append("%s: kubectl kustomize failed: %s" % (name, r.stderr.strip()))
            continue
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        c = check(name, docs, gpu, ha)
        checks += c.checks
        failures += c.failures
        print("%s: %d objects rendered" % (name, len(docs)))
    for f in failures:
        print("FAIL:", f)
    print("%d passed, %d failed" % (checks - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
