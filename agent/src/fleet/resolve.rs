//! Fleet file as written → simulated nodes, checking every value and collecting every
//! problem. Pure: CSV files for `replay` come through the caller's reader.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::Spanned;

use self::uuid::simulated_uuid;
use self::values::{celsius, parse_bandwidth, parse_cc, parse_size, watts, whole_in, whole_mw};
use super::catalog::{self, CardModel};
use super::diag::Diagnostic;
use super::schema::{Entries, GpuGroups, RawFleet, RawGpus, RawHost, RawNode, RawScalar};
use crate::gpu::{GpuInfo, PcieLink};
use crate::sim::{SimGpu, SimHost, SimNode};

/// Most GPUs one simulated node may have.
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// Longest node name (a DNS label).
const MAX_NODE_NAME: usize = 63;

const MIB: f64 = 1_048_576.0;

/// Reads a file that a fleet file refers to (a CSV to replay), by its resolved path.
pub type ReadFile<'a> = dyn FnMut(&Path) -> io::Result<String> + 'a;

/// The resolver's state: where messages point, and what it found wrong so far.
pub(super) struct Resolver<'a, 'r> {
    /// The fleet file as the user named it.
    file: &'a str,
    text: &'a str,
    /// The directory `replay` paths are relative to.
    dir: &'a Path,
    read: &'a mut ReadFile<'r>,
    /// Texts of CSV files already read (or the error already reported), by path.
    csv_texts: BTreeMap<PathBuf, Option<Arc<str>>>,
    pub diagnostics: Vec<Diagnostic>,
}

fn at<T>(spanned: &Spanned<T>) -> (u64, u64) {
    (spanned.referenced.line(), spanned.referenced.column())
}

mod telemetry;
mod uuid;
mod values;

/// A GPU group after its checks.
struct Group {
    card: CardModel,
    name: String,
    memory_bytes: u64,
    count: u32,
    /// NVLink cliques, by index within the group.
    nvlink: Vec<Vec<u32>>,
    compute_capability: Option<(u32, u32)>,
    mig: Option<bool>,
}

impl<'a, 'r> Resolver<'a, 'r> {
    pub(super) fn new(file: &'a str, text: &'a str, dir: &'a Path, read: &'a mut ReadFile<'r>) -> Self {
        Self {
            file,
            text,
            dir,
            read,
            csv_texts: BTreeMap::new(),
            diagnostics: Vec::new(),
        }
    }

    fn error(&mut self, position: (u64, u64), message: impl Into<String>, help: Option<String>) {
        let mut diagnostic = Diagnostic::at(self.file, self.text, position, message);
        diagnostic.help = help;
        self.diagnostics.push(diagnostic);
    }

    /// The fleet's name and nodes; `None` (with diagnostics) if anything is wrong.
    pub(super) fn fleet(&mut self, raw: &RawFleet) -> Option<(String, Vec<SimNode>)> {
        let name = match &raw.fleet.value {
            RawScalar::Text(name) if !name.trim().is_empty() => Some(name.trim().to_owned()),
            other => {
                self.error(
                    at(&raw.fleet),
                    format!("`fleet` must be the fleet's name, found {}", other.shown()),
                    Some("write a name such as `fleet: lab`; it seeds the simulated GPU UUIDs".to_owned()),
                );
                None
            }
        };
        if raw.nodes.value.0.is_empty() {
            self.error(
                at(&raw.nodes),
                "the fleet has no nodes",
                Some("add a node, such as `nodes: { gpu-1: { gpus: { model: A100-80GB, count: 4 } } }`".to_owned()),
            );
        }
        let fleet_name = name.clone().unwrap_or_default();
        let mut nodes = Vec::new();
        for (node_name, node) in &raw.nodes.value.0 {
            self.node_name(node_name);
            if let Some(node) = self.node(&fleet_name, &node_name.value, node) {
                nodes.push(node);
            }
        }
        if !self.diagnostics.is_empty() {
            return None;
        }
        Some((name?, nodes))
    }

    fn node_name(&mut self, name: &Spanned<String>) {
        let text = name.value.as_str();
        let valid = !text.is_empty()
            && text.len() <= MAX_NODE_NAME
            && text.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !valid {
            self.error(
                at(name),
                format!("`{text}` is not a valid node name"),
                Some(format!(
                    "use up to {MAX_NODE_NAME} letters, digits, `-`, `_` or `.`, starting with a letter or digit"
                )),
            );
        }
    }

    fn node(&mut self, fleet: &str, name: &str, raw: &RawNode) -> Option<SimNode> {
        let groups: Vec<(Option<Group>, (u64, u64))> = match &raw.gpus {
            Some(gpus) => {
                let GpuGroups(list) = &gpus.value;
                list.iter()
                    .map(|group| (self.group(group, at(gpus)), at(gpus)))
                    .collect()
            }
            None => Vec::new(),
        };
        let total: u64 = groups
            .iter()
            .filter_map(|(g, _)| g.as_ref())
            .map(|g| u64::from(g.count))
            .sum();
        if total > u64::from(MAX_GPUS_PER_NODE)
            && let Some(gpus) = &raw.gpus
        {
            self.error(
                at(gpus),
                format!("node `{name}` has {total} GPUs; a node has at most {MAX_GPUS_PER_NODE}"),
                Some("split the GPUs over several nodes".to_owned()),
            );
            return None;
        }
        let host = raw.host.as_ref().map(|host| self.host(&host.value)).unwrap_or_default();
        let labels = raw
            .labels
            .as_ref()
            .map(|labels| self.labels(labels))
            .unwrap_or_default();

        // Build the inventory group by group: indices run on across groups, NVLink stays
        // within a group (cards of one model bridged together).
        let mut gpus: Vec<(GpuInfo, CardModel)> = Vec::new();
        let mut complete = true;
        for (group, _) in groups {
            let Some(group) = group else {
                complete = false;
                continue;
            };
            let first = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
            let uuids: Vec<String> = (0..group.count)
                .map(|i| simulated_uuid(fleet, name, first.saturating_add(i)))
                .collect();
            for i in 0..group.count {
                let index = first.saturating_add(i);
                let mut peers: Vec<String> = group
                    .nvlink
                    .iter()
                    .filter(|clique| clique.contains(&i))
                    .flatten()
                    .filter(|&&peer| peer != i)
                    .filter_map(|&peer| uuids.get(usize::try_from(peer).ok()?).cloned())
                    .collect();
                peers.sort();
                peers.dedup();
                let info = GpuInfo {
                    index,
                    uuid: uuids
                        .get(usize::try_from(i).unwrap_or(usize::MAX))
                        .cloned()
                        .unwrap_or_default(),
                    name: group.name.clone(),
                    memory_total: group.memory_bytes,
                    compute_capability: group.compute_capability,
                    power_limit_mw: Some(whole_mw(group.card.power_limit_w)),
                    pcie: Some(PcieLink {
                        generation: group.card.pcie.0,
                        width: group.card.pcie.1,
                    }),
                    pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x10u32.saturating_add(index))),
                    nvlink_peers: peers,
                    mig_enabled: group.mig,
                    simulated: true,
                };
                gpus.push((info, group.card));
            }
        }

        let telemetry = raw.telemetry.as_ref().map(|t| &t.value);
        if !complete {
            // GPU indices are unknown when a group is broken: check the node's models
            // once for their own mistakes, and leave `per_gpu` indices alone.
            self.gpu_telemetry(telemetry, None, 0.0);
            return None;
        }
        let count = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
        let overrides = telemetry.map(|t| self.per_gpu(t, count)).unwrap_or_default();
        let mut sim_gpus = Vec::new();
        for (info, card) in gpus {
            let own = overrides.get(&info.index).copied();
            let models = self.gpu_telemetry(telemetry, own, info.memory_total as f64);
            sim_gpus.push(SimGpu {
                info,
                card,
                telemetry: models,
            });
        }
        Some(SimNode {
            name: name.to_owned(),
            gpus: sim_gpus,
            host,
            labels,
        })
    }

    fn group(&mut self, raw: &RawGpus, group_at: (u64, u64)) -> Option<Group> {
        let mut ok = true;
        let mut card = match &raw.model {
            Some(model) => match catalog::lookup(&model.value) {
                Some(card) => Some(*card),
                None => {
                    let names = catalog::CARDS.iter().map(|c| c.name);
                    let known = names.clone().collect::<Vec<_>>().join(", ");
                    let help = match skein_text::closest(&model.value, names) {
                        Some(close) => format!("did you mean `{close}`? Known models: {known}"),
                        None => format!(
                            "known models: {known}; for another card give `name` and `memory` instead of `model`"
                        ),
                    };
                    self.error(at(model), format!("unknown GPU model `{}`", model.value), Some(help));
                    ok = false;
                    None
                }
            },
            None => {
                if raw.name.is_none() || raw.memory.is_none() {
                    self.error(
                        group_at,
                        "a GPU group needs a `model`, or a `name` and a `memory` for a card not in the catalog",
                        Some("write `{ model: A100-80GB, count: 4 }`, or `{ name: NVIDIA RTX 6000 Ada Generation, memory: 48GiB }`".to_owned()),
                    );
                    ok = false;
                }
                Some(catalog::GENERIC)
            }
        };

        let name = match (&raw.name, &card) {
            (Some(name), _) if !name.value.trim().is_empty() => name.value.trim().to_owned(),
            (Some(name), _) => {
                self.error(
                    at(name),
                    "the GPU name is empty",
                    Some("write the name NVML reports, like `NVIDIA L40S`".to_owned()),
                );
                ok = false;
                String::new()
            }
            (None, Some(card)) => card.nvml_name.to_owned(),
            (None, None) => String::new(),
        };
        let memory_bytes = match &raw.memory {
            Some(memory) => match self.size(&memory.value) {
                Some(bytes) if bytes > 0.0 => bytes.round() as u64,
                _ => {
                    self.error(
                        at(memory),
                        format!(
                            "GPU memory must be a size like `48GiB` or a number of MiB, found {}",
                            memory.value.shown()
                        ),
                        None,
                    );
                    ok = false;
                    0
                }
            },
            None => card.map(|c| c.memory_mib.saturating_mul(1 << 20)).unwrap_or_default(),
        };
        let count = match &raw.count {
            None => 1,
            Some(count) => match count.value {
                RawScalar::Number(n) if n.fract() == 0.0 && (1.0..=f64::from(MAX_GPUS_PER_NODE)).contains(&n) => {
                    n as u32
                }
                RawScalar::Number(0.0) => {
                    self.error(
                        at(count),
                        "`count` is 0: a GPU group has at least one GPU",
                        Some("remove the group (or the whole `gpus:` key) for a node without GPUs".to_owned()),
                    );
                    ok = false;
                    0
                }
                ref other => {
                    self.error(
                        at(count),
                        format!(
                            "`count` must be a whole number from 1 to {MAX_GPUS_PER_NODE}, found {}",
                            other.shown()
                        ),
                        None,
                    );
                    ok = false;
                    0
                }
            },
        };
        let nvlink = match &raw.nvlink {
            None => Vec::new(),
            Some(nvlink) => match self.nvlink(nvlink, count) {
                Some(cliques) => cliques,
                None => {
                    ok = false;
                    Vec::new()
                }
            },
        };
        let compute_capability = match &raw.compute_capability {
            Some(cc) => {
                let parsed = match &cc.value {
                    RawScalar::Number(n) => parse_cc(&n.to_string()),
                    RawScalar::Text(text) => parse_cc(text),
                    _ => None,
                };
                if parsed.is_none() {
                    self.error(
                        at(cc),
                        format!("compute capability must be `major.minor`, found {}", cc.value.shown()),
                        Some("quote it to keep the minor digit exact: `compute_capability: \"8.9\"`".to_owned()),
                    );
                    ok = false;
                }
                parsed
            }
            None => card
                .filter(|c| c.compute_capability != (0, 0))
                .map(|c| c.compute_capability),
        };
        if let Some(card) = card.as_mut() {
            if let Some(limit) = &raw.power_limit {
                match watts(&limit.value) {
                    Some(w) if w > 0.0 => card.power_limit_w = w,
                    _ => {
                        self.error(
                            at(limit),
                            format!(
                                "`power_limit` must be a positive number of watts, found {}",
                                limit.value.shown()
                            ),
                            None,
                        );
                        ok = false;
                    }
                }
            }
            if let Some(slowdown) = &raw.slowdown_temperature {
                match celsius(&slowdown.value) {
                    Some(c) => card.thermal.slowdown_temperature_c = c,
                    None => {
                        self.error(
                            at(slowdown),
                            format!(
                                "`slowdown_temperature` must be degrees Celsius between -40 and 150, found {}",
                                slowdown.value.shown()
                            ),
                            None,
                        );
                        ok = false;
                    }
                }
            }
            if let Some(pcie) = &raw.pcie {
                let generation = whole_in(&pcie.value.generation.value, 1, 6);
                let width = whole_in(&pcie.value.width.value, 1, 32).filter(|w| w.is_power_of_two());
                if generation.is_none() {
                    self.error(at(&pcie.value.generation), "PCIe `generation` must be 1 to 6", None);
                }
                if width.is_none() {
                    self.error(
                        at(&pcie.value.width),
                        "PCIe `width` must be 1, 2, 4, 8, 16 or 32 lanes",
                        None,
                    );
                }
                match generation.zip(width) {
                    Some((generation, width)) => card.pcie = (generation as u32, width as u32),
                    None => ok = false,
                }
            }
            if let Some(ecc) = &raw.ecc {
                card.ecc = ecc.value;
            }
        }
        let mig = match (&raw.mig, &card) {
            (Some(mig), _) => Some(mig.value),
            (None, Some(card)) => card.mig.then_some(false),
            (None, None) => None,
        };
        let card = card?;
        ok.then_some(Group {
            card,
            name,
            memory_bytes,
            count,
            nvlink,
            compute_capability,
            mig,
        })
    }

    fn nvlink(&mut self, raw: &Spanned<RawScalar>, count: u32) -> Option<Vec<Vec<u32>>> {
        let help = "write `all`, `none`, or groups of GPU indices within the group, like `[[0, 1], [2, 3]]`";
        match &raw.value {
            RawScalar::Text(word) if word == "all" => Some(if count > 1 {
                vec![(0..count).collect()]
            } else {
                Vec::new()
            }),
            RawScalar::Text(word) if word == "none" => Some(Vec::new()),
            RawScalar::List(cliques) => {
                let mut out = Vec::new();
                for clique in cliques {
                    let RawScalar::List(members) = clique else {
                        self.error(
                            at(raw),
                            format!(
                                "an NVLink group must be a list of GPU indices, found {}",
                                clique.shown()
                            ),
                            Some(help.to_owned()),
                        );
                        return None;
                    };
                    let mut indices = Vec::new();
                    for member in members {
                        match whole_in(member, 0, u64::from(count.saturating_sub(1))) {
                            Some(i) if count > 0 => indices.push(i as u32),
                            _ => {
                                self.error(
                                    at(raw),
                                    format!(
                                        "NVLink names GPU {} but the group has GPUs 0 to {}",
                                        member.shown(),
                                        count.saturating_sub(1)
                                    ),
                                    Some(help.to_owned()),
                                );
                                return None;
                            }
                        }
                    }
                    indices.sort_unstable();
                    indices.dedup();
                    if indices.len() < 2 {
                        self.error(
                            at(raw),
                            "an NVLink group needs at least two GPUs",
                            Some(help.to_owned()),
                        );
                        return None;
                    }
                    out.push(indices);
                }
                Some(out)
            }
            other => {
                self.error(
                    at(raw),
                    format!("`nvlink` cannot be {}", other.shown()),
                    Some(help.to_owned()),
                );
                None
            }
        }
    }

    fn host(&mut self, raw: &RawHost) -> SimHost {
        let cpu_cores = raw.cpu_cores.as_ref().and_then(|cores| {
            let value = whole_in(&cores.value, 1, 1 << 20).and_then(|n| usize::try_from(n).ok());
            if value.is_none() {
                self.error(
                    at(cores),
                    format!(
                        "`cpu_cores` must be a whole number of at least 1, found {}",
                        cores.value.shown()
                    ),
                    None,
                );
            }
            value
        });
        let memory_bytes = raw.memory.as_ref().and_then(|memory| {
            let value = self.size(&memory.value).filter(|b| *b > 0.0).map(|b| b.round() as u64);
            if value.is_none() {
                self.error(
                    at(memory),
                    format!(
                        "host `memory` must be a size like `512GiB`, found {}",
                        memory.value.shown()
                    ),
                    None,
                );
            }
            value
        });
        let network_bits_per_second = raw.network.as_ref().and_then(|network| self.bandwidth(network));
        SimHost {
            cpu_cores,
            memory_bytes,
            network_bits_per_second,
        }
    }

    /// A node's `labels`, each checked by the rules the orchestrator applies
    /// ([`skein_proto::labels`]); the good ones (the caller drops them on any problem).
    fn labels(&mut self, raw: &Spanned<Entries<Spanned<String>, Spanned<RawScalar>>>) -> BTreeMap<String, String> {
        use skein_proto::labels::{self, MAX_LABELS};
        let entries = &raw.value.0;
        if entries.len() > MAX_LABELS {
            self.error(
                at(raw),
                format!(
                    "the node has {} labels; a node carries at most {MAX_LABELS}",
                    entries.len()
                ),
                Some("leave some out".to_owned()),
            );
        }
        let mut checked = BTreeMap::new();
        for (key, value) in entries {
            let text = match &value.value {
                RawScalar::Text(text) => text.clone(),
                RawScalar::Null => String::new(),
                RawScalar::Number(_) | RawScalar::Bool(_) => {
                    self.error(
                        at(value),
                        format!(
                            "the value of label `{}` must be text, found {}",
                            key.value,
                            value.value.shown()
                        ),
                        Some(format!(
                            "quote the value (`{}: \"…\"`): unquoted, YAML reads numbers and words such as \
                             `true`, `yes` or `y` as numbers and booleans",
                            key.value
                        )),
                    );
                    continue;
                }
                RawScalar::List(_) => {
                    self.error(
                        at(value),
                        format!(
                            "the value of label `{}` must be one word, found {}",
                            key.value,
                            value.value.shown()
                        ),
                        Some("a label has one value: `labels: { zone: lab-a }`".to_owned()),
                    );
                    continue;
                }
            };
            match labels::check(&key.value, &text) {
                Ok(()) => {
                    checked.insert(key.value.clone(), text);
                }
                Err(problem) => {
                    let position = if problem.in_value() { at(value) } else { at(key) };
                    self.error(position, problem.problem(), Some(problem.help()));
                }
            }
        }
        checked
    }

    /// The host's `network`: a link speed in bits per second, more than zero.
    fn bandwidth(&mut self, raw: &Spanned<RawScalar>) -> Option<u64> {
        let help = "write a number and a unit of bits per second: `400Mbps`, `10Gb/s`, `25 Gbit/s`, \
                    `100Gbps` (decimal prefixes k, M, G, T)";
        let (message, help) = match &raw.value {
            RawScalar::Text(text) => match parse_bandwidth(text) {
                Some(bits) if bits > 0 => return Some(bits),
                Some(_) => (
                    format!("host `network` must be faster than zero, found {}", raw.value.shown()),
                    "leave `network` out when the link speed is unknown".to_owned(),
                ),
                None => (
                    format!(
                        "host `network` must be a bandwidth like `100Gbps`, found {}",
                        raw.value.shown()
                    ),
                    // A size is the likeliest slip: the link's speed written like memory.
                    match parse_size(text) {
                        Some(_) => format!("`{}` is an amount of data, not a rate; {help}", text.trim()),
                        None => help.to_owned(),
                    },
                ),
            },
            RawScalar::Number(n) => (
                "host `network`: a bandwidth needs a unit".to_owned(),
                format!("write `{n}Gbps` for {n} gigabits per second"),
            ),
            other => (
                format!(
                    "host `network` must be a bandwidth like `100Gbps`, found {}",
                    other.shown()
                ),
                help.to_owned(),
            ),
        };
        self.error(at(raw), message, Some(help));
        None
    }
}
