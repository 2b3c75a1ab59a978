#!/usr/bin/env bash
# The deploy/ files, checked without a cluster: HAProxy's own parser, the
# Envoy file's structure, the Kubernetes grace period's and memory limit's
# arithmetic; for vad-server (haproxy.cfg, k8s/vad-server.yaml, Envoy's
# /v1/vad route) and for `laned serve` (haproxy/laned.cfg, k8s/laned.yaml,
# Envoy's /v1/models/ route).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v haproxy >/dev/null 2>&1; then
    (apt-get install -y haproxy || (apt-get update && apt-get install -y haproxy)) >/dev/null
fi
haproxy -c -f deploy/haproxy/haproxy.cfg
haproxy -c -f deploy/haproxy/laned.cfg
python3 -c "import yaml" 2>/dev/null || pip install --quiet pyyaml
python3 - <<'PY'
import yaml
envoy = yaml.safe_load(open("deploy/envoy/envoy.yaml"))
cluster = envoy["static_resources"]["clusters"][0]
assert cluster["lb_policy"] in ("RING_HASH", "MAGLEV"), cluster["lb_policy"]
assert cluster["health_checks"][0]["http_health_check"]["path"] == "/ready"
hcm = envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
assert hcm["upgrade_configs"][0]["upgrade_type"] == "websocket"
route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
assert route["match"]["prefix"] == "/v1/vad"
assert route["route"]["hash_policy"][0]["header"]["header_name"] == "x-stream-id"
docs = {d["kind"]: d for d in yaml.safe_load_all(open("deploy/k8s/vad-server.yaml"))}
pod = docs["Deployment"]["spec"]["template"]["spec"]
container = pod["containers"][0]
pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
period = container["readinessProbe"]["periodSeconds"]
assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
config = docs["ConfigMap"]["data"]["vad-server.toml"]
drain_ms = int([l for l in config.splitlines() if l.strip().startswith("drain_deadline_ms")][0].split("=")[1].split("#")[0])
grace = pod["terminationGracePeriodSeconds"]
assert grace >= pre_stop + drain_ms / 1000 + period, (grace, pre_stop, drain_ms, period)
def setting(name):
    return int([l for l in config.splitlines() if l.strip().startswith(name)][0].split("=")[1].split("#")[0])
# server/README.md's memory bound: base + max_connections x (8 x max_frame_bytes + 512 KiB).
frame, conns = setting("max_frame_bytes"), setting("max_connections")
limit = container["resources"]["limits"]["memory"]
units = {"Mi": 1 << 20, "Gi": 1 << 30}
limit_bytes = int(limit[:-2]) * units[limit[-2:]]
need = (150 << 20) + conns * (8 * frame + (512 << 10))
assert need <= limit_bytes, f"memory limit {limit} under the bound {need >> 20} MiB for {conns} connections of {frame}-byte frames"
lanes = setting("lanes") * setting("shards")
assert conns >= lanes, f"max_connections {conns} under the {lanes} lanes"
# The ring needs an endpoint per pod: Envoy's STRICT_DNS address is the
# headless Service's name.
service = docs["Service"]
assert service["spec"].get("clusterIP") == "None", "the vad-server Service must be headless (clusterIP: None)"
endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
assert endpoint["address"] == service["metadata"]["name"], (endpoint, service["metadata"]["name"])
assert endpoint["port_value"] == service["spec"]["ports"][0]["port"]
# The model baked into the image, checked against laned-models' pin.
import re
pin = re.search(r'sha256: "([0-9a-f]{64})"', open("laned-models/src/silero.rs").read()).group(1)
text = lambda name: [l for l in config.splitlines() if l.strip().startswith(name)][0].split("=", 1)[1].split("#")[0].strip().strip('"')
assert text("model_sha256") == pin, f"model_sha256 in the ConfigMap is not laned-models' pin {pin}"
# The store the ConfigMap names is redis.yaml's Service.
redis = {d["kind"]: d for d in yaml.safe_load_all(open("deploy/k8s/redis.yaml"))}
host = text("store").split("//")[1].split(":")[0]
assert host == redis["Service"]["metadata"]["name"], (host, redis["Service"]["metadata"]["name"])
proxy = {d["kind"]: d for d in yaml.safe_load_all(open("deploy/k8s/envoy.yaml"))}
assert proxy["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "/etc/envoy/envoy.yaml"
print(f"deploy: haproxy.cfg valid; envoy.yaml as described (on the headless Service); model pinned; store {host}; grace {grace}s >= preStop {pre_stop}s + drain {drain_ms / 1000}s + probe {period}s; memory {need >> 20} MiB <= {limit} for {conns} connections")
PY
# `laned serve`: its HAProxy config's backends, Envoy's /v1/models/ route
# and cluster, and k8s/laned.yaml, checked against the code's own names
# (the `[server]` keys are `Limits`' fields in server/src/settings.rs).
python3 - <<'PY'
import re
import tomllib
import yaml
# haproxy/laned.cfg: a model with a backend of its own is checked on its
# own readiness; every backend hashes x-stream-id consistently.
cfg = open("deploy/haproxy/laned.cfg").read()
backends = {block.split()[1]: block for block in re.split(r"\n(?=backend )", cfg)[1:]}
routed = re.findall(r"use_backend (\S+) if \{ path_beg /v1/models/([^/\s]+)/ \}", cfg)
assert routed, "laned.cfg routes no model to a backend of its own"
for backend, model in routed:
    assert f"option httpchk GET /v1/models/{model}/ready" in backends[backend], f"backend {backend} is not checked on /v1/models/{model}/ready"
default = re.search(r"default_backend (\S+)", cfg).group(1)
assert "option httpchk GET /ready" in backends[default], f"the default backend {default} is not checked on /ready"
for name, block in backends.items():
    assert "balance hdr(x-stream-id)" in block and "hash-type consistent" in block, f"backend {name} does not hash x-stream-id consistently"
assert re.search(r"timeout tunnel \d+[hms]", cfg), "laned.cfg gives upgraded WebSockets no tunnel timeout: the HTTP ones would cut them"
# Envoy: /v1/models/ to a ring-hashed, health-checked cluster on the
# headless laned Service.
envoy = yaml.safe_load(open("deploy/envoy/envoy.yaml"))
hcm = envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
assert hcm["upgrade_configs"][0]["upgrade_type"] == "websocket"
routes = [r for r in hcm["route_config"]["virtual_hosts"][0]["routes"] if r["match"].get("prefix") == "/v1/models/"]
assert routes, "envoy.yaml has no /v1/models/ route"
route = routes[0]["route"]
assert route["hash_policy"][0]["header"]["header_name"] == "x-stream-id"
assert route["timeout"] == "0s", "a stream's route must not time out"
cluster = {c["name"]: c for c in envoy["static_resources"]["clusters"]}[route["cluster"]]
assert cluster["lb_policy"] in ("RING_HASH", "MAGLEV"), cluster["lb_policy"]
assert cluster["type"] == "STRICT_DNS", cluster["type"]
check_path = cluster["health_checks"][0]["http_health_check"]["path"]
assert re.fullmatch(r"/ready|/v1/models/[A-Za-z0-9._-]+/ready", check_path), check_path
docs = {d["kind"]: d for d in yaml.safe_load_all(open("deploy/k8s/laned.yaml"))}
service = docs["Service"]
assert service["spec"].get("clusterIP") == "None", "the laned Service must be headless (clusterIP: None)"
endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
assert endpoint["address"] == service["metadata"]["name"], (endpoint, service["metadata"]["name"])
assert endpoint["port_value"] == service["spec"]["ports"][0]["port"]
# k8s/laned.yaml: the config and the specs its ConfigMap holds, read as
# laned serve reads them.
data = docs["ConfigMap"]["data"]
pod = docs["Deployment"]["spec"]["template"]["spec"]
container = pod["containers"][0]
args = container["args"]
assert args[0] == "serve" and "--config" in args, args
config_path = args[args.index("--config") + 1]
mount = [m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"].rstrip("/") + "/")]
assert mount, f"{config_path} is on no mounted volume"
config_key = config_path[len(mount[0]["mountPath"].rstrip("/")) + 1:]
config = tomllib.loads(data[config_key])
assert set(config) <= {"server", "models"}, f"{config_key}: tables {sorted(config)}, wanted [server] and [models]"
settings = open("server/src/settings.rs").read()
limits = re.findall(r"pub (\w+):", re.search(r"pub struct Limits \{(.*?)\n\}", settings, re.S).group(1))
server = config["server"]
unknown = sorted(set(server) - set(limits))
assert not unknown, f"{config_key}: [server] keys laned serve refuses (runner settings go in each spec's [runner]): {unknown}"
assert config.get("models"), f"{config_key}: no [models]"
lanes, builtins = 0, []
for name, spec_path in config["models"].items():
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name), f"model name {name!r}"
    assert spec_path in data, f"model {name}: its spec {spec_path} is not in the ConfigMap beside {config_key}"
    spec = tomllib.loads(data[spec_path])
    assert set(spec) <= {"model", "runner"}, f"{spec_path}: tables {sorted(spec)}, wanted [model] and [runner]"
    runner = spec.get("runner", {})
    lanes += runner.get("max_lanes", 64) * runner.get("shards", 1)
    if "builtin" in spec["model"]:
        builtins.append(spec["model"]["builtin"])
# Built-in models come from the image's cache, never fetched at start.
env = {e["name"]: e.get("value") for e in container.get("env", [])}
assert not builtins or env.get("LANED_CACHE_DIR"), f"built-in models {builtins} and no LANED_CACHE_DIR: the pod would fetch them with pip at start"
# The probes on the probe address; the Service (and Envoy) on the main one.
port_of = lambda addr: int(addr.rsplit(":", 1)[1])
ports = {p["name"]: p["containerPort"] for p in container["ports"]}
ready = container["readinessProbe"]["httpGet"]
live = container["livenessProbe"]["httpGet"]
assert ready["path"] == "/ready" or ready["path"] in {f"/v1/models/{m}/ready" for m in config["models"]}, ready["path"]
assert live["path"] == "/live", live["path"]
assert "probe_listen" in server, f"{config_key}: no probe_listen: a flood of the stream port could fail the probes"
for probe in (ready, live):
    assert ports[probe["port"]] == port_of(server["probe_listen"]), (probe, server["probe_listen"])
assert ports[service["spec"]["ports"][0]["targetPort"]] == port_of(server["listen"]) == service["spec"]["ports"][0]["port"]
# The grace period covers preStop, the drain deadline and a probe period.
pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
period = container["readinessProbe"]["periodSeconds"]
drain_ms = server.get("drain_deadline_ms", 10000)
grace = pod["terminationGracePeriodSeconds"]
assert grace >= pre_stop + drain_ms / 1000 + period, (grace, pre_stop, drain_ms, period)
# server/README.md's memory bound, and a place for every lane.
frame = server.get("max_frame_bytes", 1 << 20)
conns = server.get("max_connections", lanes + 64)
limit = container["resources"]["limits"]["memory"]
units = {"Mi": 1 << 20, "Gi": 1 << 30}
limit_bytes = int(limit[:-2]) * units[limit[-2:]]
need = (150 << 20) + conns * (8 * frame + (512 << 10))
assert need <= limit_bytes, f"memory limit {limit} under the bound {need >> 20} MiB for {conns} connections of {frame}-byte frames"
assert conns >= lanes, f"max_connections {conns} under the {lanes} lanes"
# The store is redis.yaml's Service.
redis = {d["kind"]: d for d in yaml.safe_load_all(open("deploy/k8s/redis.yaml"))}
host = server["store"].split("//")[1].split(":")[0]
assert host == redis["Service"]["metadata"]["name"], (host, redis["Service"]["metadata"]["name"])
print(f"deploy (laned serve): laned.cfg valid, {len(routed)} model(s) on their own readiness; envoy.yaml routes /v1/models/ to {cluster['name']} on the headless Service; models {sorted(config['models'])}, {lanes} lanes; store {host}; grace {grace}s >= preStop {pre_stop}s + drain {drain_ms / 1000}s + probe {period}s; memory {need >> 20} MiB <= {limit} for {conns} connections")
PY
