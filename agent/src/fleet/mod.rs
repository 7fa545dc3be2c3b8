//! Fleet files: simulated nodes and their GPUs, for development, tests and demos
//! without hardware. The schema is described in `docs/fleets.md`.
//!
//! [`load_fleet`] is the IO edge (it reads the fleet file and the CSV files it
//! replays); [`parse_fleet`] is the pure core, given the text and a reader for CSV
//! files. Problems come back together, each with file:line:column, the source line and
//! a hint ([`FleetError::Invalid`]).

pub mod catalog;
mod diag;
mod resolve;
mod schema;

use std::io::{self, Read};
use std::path::{Path, PathBuf};

pub use diag::{Diagnostic, Diagnostics};
pub use resolve::{MAX_GPUS_PER_NODE, ReadFile};

use crate::sim::{SimNode, SimulatedSource};

/// Largest fleet file read (far more than any fleet needs).
pub const MAX_FLEET_FILE_BYTES: u64 = 1 << 20;

/// Largest CSV file a `replay` model reads.
pub const MAX_CSV_FILE_BYTES: u64 = 64 << 20;

/// A fleet file, checked: its nodes with their GPUs and telemetry models.
#[derive(Debug, Clone, PartialEq)]
pub struct Fleet {
    name: String,
    /// The file as the user named it.
    file: String,
    nodes: Vec<SimNode>,
}

/// Why a fleet file or one of its nodes could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The fleet file could not be read.
    #[error("cannot read fleet file `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: io::Error,
    },
    /// The fleet file is larger than [`MAX_FLEET_FILE_BYTES`].
    #[error("fleet file `{}` is larger than {MAX_FLEET_FILE_BYTES} bytes; is it the right file?", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file was read but is wrong; every problem found is listed.
    #[error("{0}")]
    Invalid(Diagnostics),
    /// A node was asked for (`--node`) that the fleet does not have.
    #[error(
        "fleet `{fleet}` ({file}) has no node `{node}`{}; its nodes are {}",
        .suggestion.as_ref().map(|s| format!(" (did you mean `{s}`?)")).unwrap_or_default(),
        .known.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
    )]
    UnknownNode {
        /// The fleet's name.
        fleet: String,
        /// The fleet file.
        file: String,
        /// The node asked for.
        node: String,
        /// The fleet's nodes, in file order.
        known: Vec<String>,
        /// A known node whose name is close to `node`.
        suggestion: Option<String>,
    },
}

impl FleetError {
    /// The problems of an invalid file (empty for the other errors).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            FleetError::Invalid(diagnostics) => &diagnostics.0,
            _ => &[],
        }
    }
}

/// Reads and checks the fleet file at `path`, and the CSV files its `replay` models
/// name (relative to the fleet file's directory).
pub fn load_fleet(path: impl AsRef<Path>) -> Result<Fleet, FleetError> {
    let path = path.as_ref();
    let text = match read_capped(path, MAX_FLEET_FILE_BYTES) {
        Ok(Some(text)) => text,
        Ok(None) => return Err(FleetError::TooLarge { path: path.to_owned() }),
        Err(source) => {
            return Err(FleetError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let mut read_csv = |csv: &Path| match read_capped(csv, MAX_CSV_FILE_BYTES)? {
        Some(text) => Ok(text),
        None => Err(io::Error::other(format!("larger than {MAX_CSV_FILE_BYTES} bytes"))),
    };
    let dir = path.parent().unwrap_or(Path::new(""));
    parse_fleet(&path.display().to_string(), &text, dir, &mut read_csv)
}

/// Checks the fleet file text `text`, named `file` in messages. `replay` paths are
/// joined to `dir` and read through `read` (so this function does no IO itself).
pub fn parse_fleet(file: &str, text: &str, dir: &Path, read: &mut ReadFile<'_>) -> Result<Fleet, FleetError> {
    let raw: schema::RawFleet = match serde_saphyr::from_str(text) {
        Ok(raw) => raw,
        Err(error) => {
            return Err(FleetError::Invalid(Diagnostics::sorted(vec![from_yaml_error(
                file, text, &error,
            )])));
        }
    };
    let mut resolver = resolve::Resolver::new(file, text, dir, read);
    match resolver.fleet(&raw) {
        Some((name, nodes)) if resolver.diagnostics.is_empty() => Ok(Fleet {
            name,
            file: file.to_owned(),
            nodes,
        }),
        _ => Err(FleetError::Invalid(Diagnostics::sorted(resolver.diagnostics))),
    }
}

impl Fleet {
    /// The fleet's name (`lab`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node names, in file order.
    pub fn node_names(&self) -> Vec<&str> {
        self.nodes.iter().map(|node| node.name.as_str()).collect()
    }

    /// The nodes, in file order.
    pub fn nodes(&self) -> &[SimNode] {
        &self.nodes
    }

    /// GPUs over all nodes.
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|node| node.gpus.len()).sum()
    }

    /// The GPU source of node `name` (what `skein agent --fleet lab.yaml --node rtx-1`
    /// runs).
    pub fn node(&self, name: &str) -> Result<SimulatedSource, FleetError> {
        match self.nodes.iter().find(|node| node.name == name) {
            Some(node) => {
                let origin = Path::new(&self.file)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| self.file.clone());
                Ok(SimulatedSource::new(&origin, node.clone()))
            }
            None => {
                let known = self.node_names();
                Err(FleetError::UnknownNode {
                    fleet: self.name.clone(),
                    file: self.file.clone(),
                    node: name.to_owned(),
                    suggestion: skein_text::closest(name, known.iter().copied()).map(str::to_owned),
                    known: known.into_iter().map(str::to_owned).collect(),
                })
            }
        }
    }
}

/// Reads a UTF-8 file of at most `limit` bytes; `Ok(None)` if it is larger.
fn read_capped(path: &Path, limit: u64) -> io::Result<Option<String>> {
    let mut text = String::new();
    std::fs::File::open(path)?.take(limit + 1).read_to_string(&mut text)?;
    Ok((text.len() as u64 <= limit).then_some(text))
}

/// A YAML reader's error as a diagnostic: its message without the position suffix,
/// with a hint for the common mistakes.
fn from_yaml_error(file: &str, text: &str, error: &serde_saphyr::Error) -> Diagnostic {
    let location = error.location();
    let position = location.map_or((0, 0), |l| (l.line(), l.column()));
    let options = serde_saphyr::render_options! { snippets: serde_saphyr::SnippetMode::Off };
    let rendered = error.render_with_options(options);
    let suffix = format!(" at line {}, column {}", position.0, position.1);
    let message = rendered.strip_suffix(&suffix).unwrap_or(&rendered).to_owned();

    if let Some(key) = message.strip_prefix("duplicate mapping key: ") {
        let key = key.split(',').next().unwrap_or(key).trim();
        return Diagnostic::at(
            file,
            text,
            position,
            format!("`{key}` appears twice in the same mapping"),
        )
        .help("each node name (and each key of a mapping) may appear only once; rename or merge the two");
    }
    if let Some(rest) = message.strip_prefix("unknown field `")
        && let Some((field, expected)) = rest.split_once("`, expected one of ")
    {
        let expected: Vec<&str> = expected.split(", ").map(|e| e.trim_matches('`')).collect();
        let listed = expected.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ");
        let help = match skein_text::closest(field, expected.iter().copied()) {
            Some(close) => format!("did you mean `{close}`? Allowed here: {listed}"),
            None => format!("allowed here: {listed}"),
        };
        return Diagnostic::at(file, text, position, format!("unknown key `{field}`")).help(help);
    }
    let mut diagnostic = Diagnostic::at(file, text, position, message);
    if diagnostic.message.starts_with("missing field `") {
        diagnostic.message = diagnostic.message.replacen("missing field", "missing key", 1);
        diagnostic = diagnostic.help("see docs/fleets.md for the keys each section takes");
    }
    diagnostic
}
