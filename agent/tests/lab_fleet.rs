//! The reference fleet file, `workflows/fleets/lab.yaml`: its inventory, identities
//! and the node lookup.

use std::collections::BTreeMap;
use std::path::Path;

use skein_agent::{Fleet, FleetError, GpuSource, HostInventory, load_fleet};

const MIB: u64 = 1 << 20;

fn lab() -> Fleet {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/fleets/lab.yaml");
    load_fleet(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn lab_has_the_reference_fleet() {
    let fleet = lab();
    assert_eq!(fleet.name(), "lab");
    assert_eq!(fleet.node_names(), ["a100-box", "rtx-1", "rtx-2", "old-1"]);
    assert_eq!(fleet.gpu_count(), 14);

    let expect = [
        ("a100-box", 4, "NVIDIA A100-SXM4-80GB", 81_920, (8, 0)),
        ("rtx-1", 4, "NVIDIA GeForce RTX 4090", 24_564, (8, 9)),
        ("rtx-2", 4, "NVIDIA GeForce RTX 4090", 24_564, (8, 9)),
        ("old-1", 2, "Tesla V100-PCIE-16GB", 16_160, (7, 0)),
    ];
    for (node, count, name, mib, cc) in expect {
        let source = fleet.node(node).unwrap();
        let gpus = source.inventory();
        assert_eq!(gpus.len(), count, "{node}");
        for (i, gpu) in gpus.iter().enumerate() {
            assert_eq!(gpu.index as usize, i);
            assert_eq!(gpu.name, name);
            assert_eq!(gpu.memory_total, mib * MIB, "{node} GPU {i}");
            assert_eq!(gpu.compute_capability, Some(cc));
            assert!(gpu.simulated);
        }
    }
}

#[test]
fn rtx_1_is_the_one_labelled_node() {
    let fleet = lab();
    let labelled: Vec<(&str, BTreeMap<String, String>)> = fleet
        .nodes()
        .iter()
        .filter(|node| !node.labels.is_empty())
        .map(|node| (node.name.as_str(), node.labels.clone()))
        .collect();
    let zone = BTreeMap::from([("zone".to_owned(), "lab-a".to_owned())]);
    assert_eq!(labelled, [("rtx-1", zone)]);
}

#[test]
fn a100_box_is_nvlinked_all_to_all_and_the_rest_is_pcie() {
    let fleet = lab();
    let a100 = fleet.node("a100-box").unwrap();
    let uuids: Vec<&str> = a100.inventory().iter().map(|g| g.uuid.as_str()).collect();
    for gpu in a100.inventory() {
        let mut expected: Vec<&str> = uuids.iter().copied().filter(|u| *u != gpu.uuid).collect();
        expected.sort();
        assert_eq!(gpu.nvlink_peers, expected, "GPU {}", gpu.index);
        assert_eq!(gpu.mig_enabled, Some(false));
    }
    for node in ["rtx-1", "rtx-2", "old-1"] {
        for gpu in fleet.node(node).unwrap().inventory() {
            assert!(gpu.nvlink_peers.is_empty(), "{node} GPU {}", gpu.index);
            assert_eq!(gpu.mig_enabled, None);
        }
    }
}

#[test]
fn uuids_are_unique_and_stable_across_loads() {
    let first = lab();
    let second = lab();
    let mut all = Vec::new();
    for node in first.node_names() {
        let a = first.node(node).unwrap();
        let b = second.node(node).unwrap();
        assert_eq!(a.inventory(), b.inventory());
        all.extend(a.inventory().iter().map(|g| g.uuid.clone()));
    }
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count, "duplicate UUIDs");
    for uuid in &all {
        let parts: Vec<usize> = uuid.trim_start_matches("GPU-").split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{uuid}");
    }
}

#[test]
fn inventory_snapshot() {
    let fleet = lab();
    let inventory: Vec<_> = fleet
        .node_names()
        .into_iter()
        .map(|node| (node.to_owned(), fleet.node(node).unwrap().inventory().to_vec()))
        .collect();
    insta::assert_yaml_snapshot!(inventory);
}

#[test]
fn unknown_node_lists_the_known_ones() {
    let error = lab().node("rtx-3").unwrap_err();
    assert!(matches!(error, FleetError::UnknownNode { .. }));
    let shown = error.to_string().replace(env!("CARGO_MANIFEST_DIR"), "agent");
    assert_eq!(
        shown,
        "fleet `lab` (agent/../workflows/fleets/lab.yaml) has no node `rtx-3` (did you mean `rtx-1`?); \
         its nodes are `a100-box`, `rtx-1`, `rtx-2`, `old-1`"
    );
    let far = lab().node("banana").unwrap_err().to_string();
    assert!(far.contains("has no node `banana`; its nodes are"), "{far}");
}

#[test]
fn describe_and_host_facts() {
    let source = lab().node("rtx-1").unwrap();
    assert_eq!(source.describe(), "simulated node rtx-1 from lab.yaml, 4 GPUs");
    let host = source.host_inventory(HostInventory::discover());
    assert_eq!(host.hostname.as_deref(), Some("rtx-1"));
    assert_eq!(host.cpu.logical_cores, Some(64));
    assert_eq!(host.cpu.physical_cores, None);
    assert_eq!(host.memory.total_bytes, Some(256 << 30));
    assert_eq!(host.network_bits_per_second, Some(100_000_000_000));
    let explained = |field| host.unavailable.iter().filter(|u| u.field == field).count();
    assert_eq!(explained(skein_agent::host::HostField::PhysicalCores), 1);
    assert_eq!(explained(skein_agent::host::HostField::TotalMemory), 0);
    assert_eq!(explained(skein_agent::host::HostField::NetworkBandwidth), 0);
}

#[test]
fn network_links_reach_the_wire_inventory() {
    let fleet = lab();
    let wire_network = |name: &str| {
        let source = fleet.node(name).unwrap();
        let host = source.host_inventory(HostInventory::discover());
        skein_agent::daemon::inventory(&source, &host)
            .host
            .unwrap()
            .network_bits_per_second
    };
    let links: Vec<(&str, u64)> = fleet.node_names().into_iter().map(|n| (n, wire_network(n))).collect();
    assert_eq!(
        links,
        [
            ("a100-box", 100_000_000_000),
            ("rtx-1", 100_000_000_000),
            ("rtx-2", 100_000_000_000),
            ("old-1", 10_000_000_000),
        ]
    );
}

#[test]
fn a_node_without_network_reports_it_unknown_not_the_real_hosts() {
    let text = "fleet: tiny\nnodes:\n  cpu-1:\n    host: { cpu_cores: 8 }\n";
    let fleet = skein_agent::fleet::parse_fleet("tiny.yaml", text, Path::new(""), &mut |_| unreachable!()).unwrap();
    let source = fleet.node("cpu-1").unwrap();
    let mut real = HostInventory::discover();
    real.network_bits_per_second = Some(25_000_000_000);
    let host = source.host_inventory(real);
    assert_eq!(host.network_bits_per_second, None);
    let reasons: Vec<&str> = host
        .unavailable
        .iter()
        .filter(|u| u.field == skein_agent::host::HostField::NetworkBandwidth)
        .map(|u| u.reason.as_str())
        .collect();
    assert_eq!(
        reasons,
        ["simulated node: the fleet file gives no `network` for its host"]
    );
    let wire = skein_agent::daemon::inventory(&source, &host).host.unwrap();
    assert_eq!(wire.network_bits_per_second, 0);
}

#[test]
fn missing_file_names_it() {
    let error = load_fleet("no/such/fleet.yaml").unwrap_err();
    assert_eq!(error.to_string(), "cannot read fleet file `no/such/fleet.yaml`");
    assert!(std::error::Error::source(&error).is_some());
}

fn tiny(text: &str) -> Result<Fleet, FleetError> {
    skein_agent::fleet::parse_fleet("tiny.yaml", text, Path::new(""), &mut |_| unreachable!())
}

#[test]
fn labels_are_read_and_reach_the_wire_inventory() {
    let text = "fleet: tiny\nnodes:\n  cpu-1:\n    labels: { zone: lab-a, topology.kubernetes.io/rack: \"12\" }\n  \
                cpu-2:\n    host: { cpu_cores: 8 }\n";
    let fleet = tiny(text).unwrap_or_else(|e| panic!("{e}"));
    let labels = |name: &str| fleet.node(name).unwrap().node().labels.clone();
    let expected: BTreeMap<String, String> = [("zone", "lab-a"), ("topology.kubernetes.io/rack", "12")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(labels("cpu-1"), expected);
    assert!(labels("cpu-2").is_empty());

    // What `skein plan --fleet` registers, as a live agent of the node would.
    let wire: Vec<(String, BTreeMap<String, String>)> = skein_agent::daemon::fleet_messages(&fleet, 0.0)
        .into_iter()
        .map(|(register, _)| (register.node_name, register.inventory.unwrap().labels))
        .collect();
    assert_eq!(
        wire,
        [("cpu-1".to_owned(), expected), ("cpu-2".to_owned(), BTreeMap::new())]
    );
}

#[test]
fn bad_labels_are_each_reported_where_they_are() {
    let text = "fleet: tiny\nnodes:\n  cpu-1:\n    labels: { zone: , rack: 12, -x: a, gpu: y, ok: [a, b] }\n";
    let error = tiny(text).unwrap_err();
    let found: Vec<(String, Option<String>)> = error
        .diagnostics()
        .iter()
        .map(|d| (d.one_line(), d.help.clone()))
        .collect();
    let help = |text: &str| Some(text.to_owned());
    let quote = |key: &str| {
        help(&format!(
            "quote the value (`{key}: \"…\"`): unquoted, YAML reads numbers and words such as `true`, `yes` or \
             `y` as numbers and booleans"
        ))
    };
    assert_eq!(
        found,
        [
            (
                "tiny.yaml:4:19: label `zone` has an empty value".to_owned(),
                help("give it a value (such as `lab-a`), or leave the label out")
            ),
            (
                "tiny.yaml:4:29: the value of label `rack` must be text, found 12".to_owned(),
                quote("rack")
            ),
            (
                "tiny.yaml:4:33: label key `-x` begins or ends with a symbol".to_owned(),
                help("begin and end it with a letter or a digit")
            ),
            (
                "tiny.yaml:4:45: the value of label `gpu` must be text, found true".to_owned(),
                quote("gpu")
            ),
            (
                "tiny.yaml:4:52: the value of label `ok` must be one word, found [\"a\", \"b\"]".to_owned(),
                help("a label has one value: `labels: { zone: lab-a }`")
            ),
        ]
    );
}
