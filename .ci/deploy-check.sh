#!/usr/bin/env bash
# The deploy/ files, checked without a cluster: HAProxy's own parser, the
# Envoy file's structure, the Kubernetes grace period's and memory limit's
# arithmetic.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v haproxy >/dev/null 2>&1; then
    (apt-get install -y haproxy || (apt-get update && apt-get install -y haproxy)) >/dev/null
fi
haproxy -c -f deploy/haproxy/haproxy.cfg
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
