//! Fleet file as written → simulated nodes, checking every value and collecting every
//! problem. Pure: CSV files for `replay` come through the caller's reader.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::Spanned;

use super::catalog::{self, CardModel};
use super::diag::Diagnostic;
use super::schema::{Entries, GpuGroups, RawFleet, RawGpus, RawHost, RawModel, RawNode, RawScalar, RawTelemetry};
use crate::gpu::{GpuInfo, PcieLink, ThrottleReasons, format_uuid};
use crate::sim::{GpuTelemetry, SimGpu, SimHost, SimNode};
use crate::telemetry::{AfterEnd, Interpolation, Model, Series, Signal};

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

/// A metric of [`GpuTelemetry`], with its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Utilization,
    MemoryUtilization,
    MemoryUsed,
    ForeignMemory,
    Temperature,
    Power,
    SmClock,
    EccCorrected,
    EccUncorrected,
    Throttle,
}

const METRICS: [Metric; 10] = [
    Metric::Utilization,
    Metric::MemoryUtilization,
    Metric::MemoryUsed,
    Metric::ForeignMemory,
    Metric::Temperature,
    Metric::Power,
    Metric::SmClock,
    Metric::EccCorrected,
    Metric::EccUncorrected,
    Metric::Throttle,
];

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Utilization => "utilization",
            Metric::MemoryUtilization => "memory_utilization",
            Metric::MemoryUsed => "memory_used",
            Metric::ForeignMemory => "foreign_memory",
            Metric::Temperature => "temperature",
            Metric::Power => "power",
            Metric::SmClock => "sm_clock",
            Metric::EccCorrected => "ecc_corrected",
            Metric::EccUncorrected => "ecc_uncorrected",
            Metric::Throttle => "throttle",
        }
    }

    fn raw(self, telemetry: &RawTelemetry) -> Option<&Spanned<RawModel>> {
        match self {
            Metric::Utilization => telemetry.utilization.as_ref(),
            Metric::MemoryUtilization => telemetry.memory_utilization.as_ref(),
            Metric::MemoryUsed => telemetry.memory_used.as_ref(),
            Metric::ForeignMemory => telemetry.foreign_memory.as_ref(),
            Metric::Temperature => telemetry.temperature.as_ref(),
            Metric::Power => telemetry.power.as_ref(),
            Metric::SmClock => telemetry.sm_clock.as_ref(),
            Metric::EccCorrected => telemetry.ecc_corrected.as_ref(),
            Metric::EccUncorrected => telemetry.ecc_uncorrected.as_ref(),
            Metric::Throttle => telemetry.throttle.as_ref(),
        }
    }

    fn slot(self, telemetry: &mut GpuTelemetry) -> &mut Option<Model> {
        match self {
            Metric::Utilization => &mut telemetry.utilization,
            Metric::MemoryUtilization => &mut telemetry.memory_utilization,
            Metric::MemoryUsed => &mut telemetry.memory_used,
            Metric::ForeignMemory => &mut telemetry.foreign_memory,
            Metric::Temperature => &mut telemetry.temperature,
            Metric::Power => &mut telemetry.power,
            Metric::SmClock => &mut telemetry.sm_clock,
            Metric::EccCorrected => &mut telemetry.ecc_corrected,
            Metric::EccUncorrected => &mut telemetry.ecc_uncorrected,
            Metric::Throttle => &mut telemetry.throttle,
        }
    }

    /// How values of this metric may be written, for help texts.
    fn unit_help(self) -> &'static str {
        match self {
            Metric::Utilization | Metric::MemoryUtilization => {
                "a fraction between 0 and 1 (`0.9`) or a percentage (`\"90%\"`)"
            }
            Metric::MemoryUsed | Metric::ForeignMemory => {
                "a size (`20GiB`, `512MiB`), a share of the GPU's memory (`\"50%\"`) or a number of MiB"
            }
            Metric::Temperature => "degrees Celsius between -40 and 150 (`85`)",
            Metric::Power => "watts (`300` or `300W`)",
            Metric::SmClock => "MHz (`1410`)",
            Metric::EccCorrected | Metric::EccUncorrected => "an error count (`0`, `12`)",
            Metric::Throttle => {
                "a throttle reason (`hw_thermal_slowdown`), a list of them, `none`, or NVML's bit set as a number"
            }
        }
    }

    /// A plain number of this metric in base units (what CSV columns hold).
    fn number_in_base_units(self, n: f64) -> f64 {
        match self {
            Metric::MemoryUsed | Metric::ForeignMemory => n * MIB,
            _ => n,
        }
    }
}

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
                    let help = match crate::suggest::closest(&model.value, names) {
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

    /// The `per_gpu` overrides by GPU index, checked against the node's GPU count.
    fn per_gpu<'t>(&mut self, telemetry: &'t RawTelemetry, count: u32) -> BTreeMap<u32, &'t RawTelemetry> {
        let mut out = BTreeMap::new();
        let Some(per_gpu) = &telemetry.per_gpu else {
            return out;
        };
        for (key, value) in &per_gpu.value.0 {
            let index = whole_in(&key.value, 0, u64::from(u32::MAX)).map(|i| i as u32);
            match index {
                Some(i) if i < count => {
                    if let Some(nested) = &value.value.per_gpu {
                        self.error(at(nested), "`per_gpu` cannot be nested inside `per_gpu`", None);
                    }
                    out.insert(i, &value.value);
                }
                Some(i) => {
                    let help = match count {
                        0 => "the node has no GPUs".to_owned(),
                        n => format!("the node's GPUs are numbered 0 to {}", n - 1),
                    };
                    self.error(
                        at(key),
                        format!("`per_gpu` names GPU {i}, which does not exist"),
                        Some(help),
                    );
                }
                None => {
                    self.error(
                        at(key),
                        format!("`per_gpu` keys are GPU indices, found {}", key.value.shown()),
                        Some("write `per_gpu: { 2: { temperature: 90 } }`".to_owned()),
                    );
                }
            }
        }
        out
    }

    fn gpu_telemetry(&mut self, node: Option<&RawTelemetry>, own: Option<&RawTelemetry>, total: f64) -> GpuTelemetry {
        let mut out = GpuTelemetry::default();
        for metric in METRICS {
            let raw = own
                .and_then(|t| metric.raw(t))
                .or_else(|| node.and_then(|t| metric.raw(t)));
            if let Some(raw) = raw {
                *metric.slot(&mut out) = self.model(metric, raw, total);
            }
        }
        out
    }

    /// A key a model needs: reported at the model, with an example, when missing.
    fn required<'v, T>(&mut self, value: Option<&'v T>, key: &str, model: &str, model_at: (u64, u64)) -> Option<&'v T> {
        if value.is_none() {
            let example = match model {
                "ramp" => "`ramp: { from: 0.1, to: 0.9, over: 60s }` (`start` is optional)",
                "square" => "`square: { low: 0.05, high: 0.9, period: 30s }` (`duty` is optional)",
                "spike" => "`spike: { base: 45, peak: 92, at: 60s, duration: 10s }`",
                _ => {
                    "`replay: { csv: traces/util.csv, column: util }` (`time_column`, `scale` and `loop` are optional)"
                }
            };
            self.error(
                model_at,
                format!("`{model}` needs `{key}`"),
                Some(format!("write {example}")),
            );
        }
        value
    }

    fn model(&mut self, metric: Metric, raw: &Spanned<RawModel>, total: f64) -> Option<Model> {
        let model_at = at(raw);
        let signal = match &raw.value {
            RawModel::Idle => return Some(Model::Idle),
            RawModel::Value(value) => Signal::Constant(self.level(metric, value, model_at, total)?),
            RawModel::Constant(value) => Signal::Constant(self.level(metric, &value.value, at(value), total)?),
            RawModel::Ramp(ramp) => {
                if metric == Metric::Throttle {
                    self.error(
                        model_at,
                        "`throttle` is a set of reasons and cannot ramp",
                        Some("use `square`, `spike` or `replay` to switch reasons on and off".to_owned()),
                    );
                    return None;
                }
                let from = self.required(ramp.from.as_ref(), "from", "ramp", model_at);
                let to = self.required(ramp.to.as_ref(), "to", "ramp", model_at);
                let over = self.required(ramp.over.as_ref(), "over", "ramp", model_at);
                let from = from.and_then(|v| self.level(metric, &v.value, at(v), total));
                let to = to.and_then(|v| self.level(metric, &v.value, at(v), total));
                let over = over.and_then(|v| self.duration(v, "`over`", true));
                let start = ramp
                    .start
                    .as_ref()
                    .map_or(Some(0.0), |s| self.duration(s, "`start`", false));
                Signal::Ramp {
                    from: from?,
                    to: to?,
                    start_s: start?,
                    over_s: over?,
                }
            }
            RawModel::Square(square) => {
                let low = self.required(square.low.as_ref(), "low", "square", model_at);
                let high = self.required(square.high.as_ref(), "high", "square", model_at);
                let period = self.required(square.period.as_ref(), "period", "square", model_at);
                let low = low.and_then(|v| self.level(metric, &v.value, at(v), total));
                let high = high.and_then(|v| self.level(metric, &v.value, at(v), total));
                let period = period.and_then(|v| self.duration(v, "`period`", true));
                let duty = match &square.duty {
                    None => Some(0.5),
                    Some(duty) => match duty.value {
                        RawScalar::Number(d) if d > 0.0 && d < 1.0 => Some(d),
                        ref other => {
                            self.error(
                                at(duty),
                                format!(
                                    "`duty` must be a fraction between 0 and 1 (exclusive), found {}",
                                    other.shown()
                                ),
                                Some("`duty: 0.25` spends the first quarter of each period at `high`".to_owned()),
                            );
                            None
                        }
                    },
                };
                Signal::Square {
                    low: low?,
                    high: high?,
                    period_s: period?,
                    duty: duty?,
                }
            }
            RawModel::Spike(spike) => {
                let base = self.required(spike.base.as_ref(), "base", "spike", model_at);
                let peak = self.required(spike.peak.as_ref(), "peak", "spike", model_at);
                let at_s = self.required(spike.at.as_ref(), "at", "spike", model_at);
                let duration = self.required(spike.duration.as_ref(), "duration", "spike", model_at);
                let base = base.and_then(|v| self.level(metric, &v.value, at(v), total));
                let peak = peak.and_then(|v| self.level(metric, &v.value, at(v), total));
                let at_s = at_s.and_then(|v| self.duration(v, "`at`", false));
                let duration = duration.and_then(|v| self.duration(v, "`duration`", true));
                Signal::Spike {
                    base: base?,
                    peak: peak?,
                    at_s: at_s?,
                    duration_s: duration?,
                }
            }
            RawModel::Replay(replay) => {
                let csv = self.required(replay.csv.as_ref(), "csv", "replay", model_at);
                let column = self.required(replay.column.as_ref(), "column", "replay", model_at);
                let scale = match &replay.scale {
                    None => Some(1.0),
                    Some(scale) => match scale.value {
                        RawScalar::Number(s) if s.is_finite() => Some(s),
                        ref other => {
                            self.error(
                                at(scale),
                                format!("`scale` must be a number, found {}", other.shown()),
                                None,
                            );
                            None
                        }
                    },
                };
                let interpolation = if metric == Metric::Throttle {
                    Interpolation::Step
                } else {
                    Interpolation::Linear
                };
                let after_end = match &replay.repeat {
                    Some(repeat) if repeat.value => AfterEnd::Loop,
                    _ => AfterEnd::Hold,
                };
                let time_column = replay.time_column.as_ref().map_or("time", |c| c.value.as_str());
                let series = self.replay(csv?, column?, time_column, interpolation, after_end)?;
                let scale = scale?;
                Signal::Replay(Arc::new(series)).map_levels(|v| metric.number_in_base_units(v * scale))
            }
        };
        Some(Model::Signal(signal))
    }

    fn replay(
        &mut self,
        csv: &Spanned<String>,
        column: &Spanned<String>,
        time_column: &str,
        interpolation: Interpolation,
        after_end: AfterEnd,
    ) -> Option<Series> {
        let path = self.dir.join(&csv.value);
        let text = match self.csv_texts.get(&path) {
            Some(text) => text.clone()?,
            None => {
                let text = match (self.read)(&path) {
                    Ok(text) => Some(Arc::<str>::from(text)),
                    Err(error) => {
                        self.error(
                            at(csv),
                            format!("cannot read `{}`: {error}", csv.value),
                            Some("the path is relative to the fleet file's directory".to_owned()),
                        );
                        None
                    }
                };
                self.csv_texts.insert(path.clone(), text.clone());
                text?
            }
        };
        match Series::parse_csv(&text, time_column, &column.value, interpolation, after_end) {
            Ok(series) => Some(series),
            Err(problem) => {
                // A missing column is the fleet file's mistake; the rest are the CSV's.
                let mut diagnostic = if problem.message.contains("value column") {
                    Diagnostic::at(self.file, self.text, at(column), problem.message)
                } else {
                    let file = path.display().to_string();
                    Diagnostic::at(&file, &text, (problem.line as u64, 1), problem.message)
                };
                diagnostic.help = problem.help;
                self.diagnostics.push(diagnostic);
                None
            }
        }
    }

    fn duration(&mut self, raw: &Spanned<RawScalar>, what: &str, positive: bool) -> Option<f64> {
        let help = "write a number with a unit: `500ms`, `30s`, `5m`, `1h`";
        let seconds = match &raw.value {
            RawScalar::Text(text) => match humantime::parse_duration(text.trim()) {
                Ok(duration) => duration.as_secs_f64(),
                Err(error) => {
                    self.error(
                        at(raw),
                        format!("{what}: `{text}` is not a duration ({error})"),
                        Some(help.to_owned()),
                    );
                    return None;
                }
            },
            RawScalar::Number(n) => {
                self.error(
                    at(raw),
                    format!("{what}: a duration needs a unit"),
                    Some(format!("write `{n}s` for {n} seconds")),
                );
                return None;
            }
            other => {
                self.error(
                    at(raw),
                    format!("{what} must be a duration, found {}", other.shown()),
                    Some(help.to_owned()),
                );
                return None;
            }
        };
        if positive && seconds <= 0.0 {
            self.error(
                at(raw),
                format!("{what} must be longer than zero"),
                Some(help.to_owned()),
            );
            return None;
        }
        Some(seconds)
    }

    /// A value of `metric` in base units (fraction, bytes, °C, W, MHz, count, bit set).
    fn level(&mut self, metric: Metric, raw: &RawScalar, position: (u64, u64), total: f64) -> Option<f64> {
        let value = match metric {
            Metric::Utilization | Metric::MemoryUtilization => match raw {
                RawScalar::Number(n) if (0.0..=1.0).contains(n) => Some(*n),
                RawScalar::Number(n) if *n > 1.0 && *n <= 100.0 => {
                    self.error(
                        position,
                        format!("{} {n} is not a fraction between 0 and 1", metric.name()),
                        Some(format!("write `{}` or `\"{n}%\"`", n / 100.0)),
                    );
                    return None;
                }
                RawScalar::Text(text) => percent(text),
                _ => None,
            },
            Metric::MemoryUsed | Metric::ForeignMemory => match raw {
                RawScalar::Text(text) => match percent(text) {
                    Some(share) => Some(share * total),
                    None => parse_size(text),
                },
                RawScalar::Number(n) if *n >= 0.0 => Some(n * MIB),
                _ => None,
            },
            Metric::Temperature => celsius(raw),
            Metric::Power => watts(raw).filter(|w| *w >= 0.0),
            Metric::SmClock | Metric::EccCorrected | Metric::EccUncorrected => match raw {
                RawScalar::Number(n) if *n >= 0.0 && n.is_finite() => Some(*n),
                _ => None,
            },
            Metric::Throttle => return self.throttle(raw, position),
        };
        if value.is_none() {
            self.error(
                position,
                format!("{} cannot be {}", metric.name(), raw.shown()),
                Some(format!("{} is {}", metric.name(), metric.unit_help())),
            );
        }
        value
    }

    fn throttle(&mut self, raw: &RawScalar, position: (u64, u64)) -> Option<f64> {
        let mut unknown = None;
        let mut reason = |item: &RawScalar| -> Option<u64> {
            match item {
                RawScalar::Number(n) if n.fract() == 0.0 && *n >= 0.0 && *n < 9.0e15 => Some(*n as u64),
                RawScalar::Text(name) if name == "none" => Some(0),
                RawScalar::Text(name) => match ThrottleReasons::from_name(name.trim()) {
                    Some(reason) => Some(reason.bits()),
                    None => {
                        unknown = Some(name.clone());
                        None
                    }
                },
                _ => None,
            }
        };
        let bits = match raw {
            RawScalar::List(items) => items.iter().map(&mut reason).try_fold(0u64, |bits, b| Some(bits | b?)),
            item => reason(item),
        };
        if bits.is_none() {
            let known = ThrottleReasons::all_names().collect::<Vec<_>>().join(", ");
            let (message, help) = match unknown {
                Some(name) => (
                    format!("unknown throttle reason `{name}`"),
                    match crate::suggest::closest(&name, ThrottleReasons::all_names()) {
                        Some(close) => format!("did you mean `{close}`? Reasons: {known}"),
                        None => format!("reasons: {known}"),
                    },
                ),
                None => (
                    format!("throttle cannot be {}", raw.shown()),
                    format!("throttle is {}", Metric::Throttle.unit_help()),
                ),
            };
            self.error(position, message, Some(help));
        }
        bits.map(|b| b as f64)
    }

    fn size(&mut self, raw: &RawScalar) -> Option<f64> {
        match raw {
            RawScalar::Number(n) if *n >= 0.0 => Some(n * MIB),
            RawScalar::Text(text) => parse_size(text),
            _ => None,
        }
    }
}

/// `"90%"` → 0.9 (0–100 %).
fn percent(text: &str) -> Option<f64> {
    let number: f64 = text.trim().strip_suffix('%')?.trim().parse().ok()?;
    (0.0..=100.0).contains(&number).then_some(number / 100.0)
}

/// `"20GiB"`, `"512 MiB"`, `"1.5GB"`, `"1024B"` → bytes.
fn parse_size(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.trim().parse().ok()?;
    let factor = match unit.trim().to_ascii_lowercase().as_str() {
        "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => MIB,
        "gib" => MIB * 1024.0,
        "tib" => MIB * 1024.0 * 1024.0,
        _ => return None,
    };
    (number.is_finite() && number >= 0.0).then_some(number * factor)
}

/// `"100Gbps"`, `"10Gb/s"`, `"25 Gbit/s"`, `"400mbps"` → bits per second. Prefixes are
/// decimal (1 Gbps is 10^9 bits per second) and, like the rest of the unit, of any case,
/// so `B` is a bit here too.
fn parse_bandwidth(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.trim().parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let prefix = ["bps", "b/s", "bit/s", "bits/s"]
        .iter()
        .find_map(|per_second| unit.strip_suffix(per_second))?;
    let factor = match prefix {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return None,
    };
    let bits = number * factor;
    // `u64::MAX as f64` rounds up to 2^64, which no u64 holds.
    (bits.is_finite() && bits >= 0.0 && bits < u64::MAX as f64).then(|| bits.round() as u64)
}

fn celsius(raw: &RawScalar) -> Option<f64> {
    match raw {
        RawScalar::Number(n) if (-40.0..=150.0).contains(n) => Some(*n),
        _ => None,
    }
}

fn watts(raw: &RawScalar) -> Option<f64> {
    match raw {
        RawScalar::Number(n) if n.is_finite() => Some(*n),
        RawScalar::Text(text) => text
            .trim()
            .strip_suffix('W')?
            .trim()
            .parse()
            .ok()
            .filter(|w: &f64| w.is_finite()),
        _ => None,
    }
}

fn whole_in(raw: &RawScalar, min: u64, max: u64) -> Option<u64> {
    match raw {
        RawScalar::Number(n) if n.fract() == 0.0 && *n >= min as f64 && *n <= max as f64 => Some(*n as u64),
        _ => None,
    }
}

fn parse_cc(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.').unwrap_or((text.trim(), "0"));
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn whole_mw(watts: f64) -> u32 {
    u32::try_from((watts * 1000.0).round().max(0.0) as u64).unwrap_or(u32::MAX)
}

/// A deterministic NVML-shaped UUID for GPU `index` of `node` in `fleet`: the same
/// names give the same identity on every start and every machine.
pub(crate) fn simulated_uuid(fleet: &str, node: &str, index: u32) -> String {
    let key = format!("skein-sim\0{fleet}\0{node}\0{index}");
    let high = mix(fnv1a(key.as_bytes(), 0xcbf2_9ce4_8422_2325));
    let low = mix(fnv1a(key.as_bytes(), 0x6c62_272e_07bb_0142));
    let mut bytes = [0u8; 16];
    let (first, second) = bytes.split_at_mut(8);
    first.copy_from_slice(&high.to_be_bytes());
    second.copy_from_slice(&low.to_be_bytes());
    format_uuid(bytes)
}

/// FNV-1a, 64 bits, from `seed` (stable across Rust versions, unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// splitmix64's finaliser: spreads FNV's weak high bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_percentages() {
        assert_eq!(parse_size("20GiB"), Some(20.0 * 1024.0 * MIB));
        assert_eq!(parse_size("512 MiB"), Some(512.0 * MIB));
        assert_eq!(parse_size("1.5GB"), Some(1.5e9));
        assert_eq!(parse_size("20"), None);
        assert_eq!(parse_size("20 parsecs"), None);
        assert_eq!(percent("90%"), Some(0.9));
        assert_eq!(percent("190%"), None);
        assert_eq!(parse_cc("8.9"), Some((8, 9)));
        assert_eq!(parse_cc("9"), Some((9, 0)));
    }

    #[test]
    fn bandwidths_are_decimal_bits_per_second_in_any_case() {
        assert_eq!(parse_bandwidth("100Gbps"), Some(100_000_000_000));
        assert_eq!(parse_bandwidth("10Gb/s"), Some(10_000_000_000));
        assert_eq!(parse_bandwidth("25 Gbit/s"), Some(25_000_000_000));
        assert_eq!(parse_bandwidth("400Mbps"), Some(400_000_000));
        assert_eq!(parse_bandwidth(" 400 MBPS "), Some(400_000_000));
        assert_eq!(parse_bandwidth("2.5gbits/s"), Some(2_500_000_000));
        assert_eq!(parse_bandwidth("1.6Tbps"), Some(1_600_000_000_000));
        assert_eq!(parse_bandwidth("56kbps"), Some(56_000));
        assert_eq!(parse_bandwidth("9600bps"), Some(9_600));
        assert_eq!(parse_bandwidth("0Gbps"), Some(0));
        assert_eq!(parse_bandwidth("100"), None);
        assert_eq!(parse_bandwidth("10GB"), None);
        assert_eq!(parse_bandwidth("10GiB/s"), None);
        assert_eq!(parse_bandwidth("Gbps"), None);
        assert_eq!(parse_bandwidth("-10Gbps"), None);
        assert_eq!(parse_bandwidth("100000000000Tbps"), None);
    }

    #[test]
    fn uuids_are_stable_and_distinct() {
        let a = simulated_uuid("lab", "rtx-1", 0);
        assert_eq!(a, simulated_uuid("lab", "rtx-1", 0));
        assert_ne!(a, simulated_uuid("lab", "rtx-1", 1));
        assert_ne!(a, simulated_uuid("lab", "rtx-2", 0));
        assert_ne!(a, simulated_uuid("lab2", "rtx-1", 0));
        assert_eq!(a.len(), "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".len());
    }
}
