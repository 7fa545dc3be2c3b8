//! The house checks itself, in rust-analyzer's manner: tests that read the source tree
//! and the docs and fail when they drift apart.
//!
//! - every `pub mod` of a crate (and of any module with a `# Layout` section) is listed
//!   there, and every listed module exists;
//! - the crate dependency lists in `docs/ARCHITECTURE.md` ("Dependency direction") equal
//!   the `Cargo.toml` files;
//! - every file path and every Rust name `docs/ARCHITECTURE.md` mentions exists;
//! - every GPU of `skein-gpu-catalog` has its row in `docs/fleets.md`, and no row names
//!   a GPU the catalog lacks;
//! - no non-test source file is over 800 lines;
//! - no module imports its siblings in a circle.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a non-test source file may have.
const MAX_LINES: usize = 800;

/// The workspace's root: the parent of this crate's directory.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tidy crate lives in the workspace root")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("reading {}: {error}", path.display()))
}

/// Every file under `dir` (recursively) whose name ends in one of `extensions`, skipping
/// build output and installed packages.
fn files_under(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | "node_modules" | ".git") {
                    stack.push(path);
                }
            } else if extensions.iter().any(|extension| name.ends_with(extension)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A workspace member: its directory, package name and the workspace crates it depends
/// on, normal (with build) and for tests.
struct Member {
    dir: PathBuf,
    name: String,
    deps: BTreeSet<String>,
    dev_deps: BTreeSet<String>,
}

fn members() -> Vec<Member> {
    let manifest = read(&root().join("Cargo.toml"));
    let list = manifest
        .split_once("members = [")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("the workspace's `members = [...]`");
    let dirs: Vec<&str> = list
        .split(',')
        .map(|item| item.trim().trim_matches('"'))
        .filter(|item| !item.is_empty())
        .collect();
    dirs.into_iter()
        .map(|dir| {
            let dir = root().join(dir);
            let text = read(&dir.join("Cargo.toml"));
            let mut name = String::new();
            let mut section = String::new();
            let (mut deps, mut dev_deps) = (BTreeSet::new(), BTreeSet::new());
            for line in text.lines().map(str::trim) {
                if line.starts_with('[') {
                    section = line.trim_matches(['[', ']']).to_string();
                    continue;
                }
                let key = line.split(['=', '.', ' ']).next().unwrap_or("");
                match section.as_str() {
                    "package" if key == "name" => name = line.split('"').nth(1).unwrap_or("").to_string(),
                    "dependencies" | "build-dependencies" if key.starts_with("skein-") => {
                        deps.insert(key.to_string());
                    }
                    "dev-dependencies" if key.starts_with("skein-") => {
                        dev_deps.insert(key.to_string());
                    }
                    _ => {}
                }
            }
            Member {
                dir,
                name,
                deps,
                dev_deps,
            }
        })
        .collect()
}

/// The lines of the `//!` doc of a file, without the `//!` (and one space).
fn inner_doc(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim_start)
        .skip_while(|line| !line.starts_with("//!"))
        .take_while(|line| line.starts_with("//!"))
        .map(|line| {
            line.trim_start_matches("//!")
                .strip_prefix(' ')
                .unwrap_or(line.trim_start_matches("//!"))
        })
        .collect()
}

/// The modules a `# Layout` section lists: the bullets that start with ``[`name`]``.
fn layout_modules(doc: &[&str]) -> Option<BTreeSet<String>> {
    let start = doc.iter().position(|line| line.trim() == "# Layout")?;
    let mut listed = BTreeSet::new();
    for line in &doc[start + 1..] {
        if line.starts_with('#') {
            break;
        }
        // "- [`a`]: …", or several at once: "- [`a`], [`b`]: …".
        let Some(rest) = line.strip_prefix("- [`") else {
            continue;
        };
        let head = rest.split("`]:").next().unwrap_or(rest);
        for name in head.split("[`").map(|item| item.split("`]").next().unwrap_or(item)) {
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                listed.insert(name.to_string());
            }
        }
    }
    Some(listed)
}

/// The `pub mod` items declared at the top level of a file.
fn public_modules(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(['{', ';', ' ']).trim().to_string())
        .collect()
}

#[test]
fn every_public_module_is_in_its_layout() {
    let mut problems = Vec::new();
    for member in members() {
        let lib = member.dir.join("src/lib.rs");
        for file in files_under(&member.dir.join("src"), &[".rs"]) {
            let text = read(&file);
            let doc = inner_doc(&text);
            let public = public_modules(&text);
            let shown = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
            let listed = match layout_modules(&doc) {
                Some(listed) => listed,
                // A crate root with public modules must have a layout; other modules
                // may go without one.
                None if file == lib && !public.is_empty() => {
                    problems.push(format!(
                        "{shown}: has `pub mod`s but no `//! # Layout` section listing them"
                    ));
                    continue;
                }
                None => continue,
            };
            for missing in public.difference(&listed) {
                problems.push(format!(
                    "{shown}: `pub mod {missing}` is not in its `# Layout` (add a \"- [`{missing}`]: …\" line)"
                ));
            }
            for gone in listed.difference(&public) {
                problems.push(format!(
                    "{shown}: `# Layout` lists [`{gone}`], which is not a `pub mod` of this file"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "crate layouts drifted:\n{}", problems.join("\n"));
}

/// The `crate → deps` lines of the fenced blocks of a section of ARCHITECTURE.md: the
/// first block lists normal dependencies, the second dependencies of tests only.
fn documented_dependencies() -> (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, BTreeSet<String>>) {
    let text = read(&root().join("docs/ARCHITECTURE.md"));
    let section = text
        .split_once("## Dependency direction")
        .map(|(_, rest)| rest.split("\n## ").next().unwrap_or(rest))
        .expect("docs/ARCHITECTURE.md has a \"## Dependency direction\" section");
    let blocks: Vec<&str> = section.split("```").skip(1).step_by(2).collect();
    assert!(
        blocks.len() >= 2,
        "\"## Dependency direction\" needs two fenced blocks: dependencies, and those of tests only"
    );
    let parse = |block: &str| {
        let mut graph = BTreeMap::new();
        for line in block.lines().skip(1).filter(|line| line.contains('→')) {
            let (from, to) = line.split_once('→').unwrap_or_default();
            let to: BTreeSet<String> = to
                .split(',')
                .map(|name| name.trim().to_string())
                .filter(|name| name.starts_with("skein"))
                .collect();
            for from in from.split(',').map(str::trim) {
                graph.insert(from.to_string(), to.clone());
            }
        }
        graph
    };
    (parse(blocks[0]), parse(blocks[1]))
}

#[test]
fn the_documented_crate_graph_is_the_cargo_graph() {
    let (documented, documented_dev) = documented_dependencies();
    let members = members();
    let actual: BTreeMap<String, BTreeSet<String>> = members.iter().map(|m| (m.name.clone(), m.deps.clone())).collect();
    let actual_dev: BTreeMap<String, BTreeSet<String>> = members
        .iter()
        .filter(|m| !m.dev_deps.is_empty())
        .map(|m| (m.name.clone(), m.dev_deps.clone()))
        .collect();
    assert_eq!(
        documented, actual,
        "docs/ARCHITECTURE.md's dependency block (left) differs from the Cargo.toml files (right)"
    );
    assert_eq!(
        documented_dev, actual_dev,
        "docs/ARCHITECTURE.md's block of test dependencies (left) differs from the Cargo.toml files' [dev-dependencies] (right)"
    );
}

/// Every identifier that appears in the workspace's Rust, JavaScript and proto sources.
fn identifiers() -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for file in files_under(root(), &[".rs", ".js", ".mjs", ".proto"]) {
        for word in read(&file).split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if !word.is_empty() {
                words.insert(word.to_string());
            }
        }
    }
    words
}

#[test]
fn the_architecture_map_names_what_exists() {
    let text = read(&root().join("docs/ARCHITECTURE.md"));
    let files: Vec<String> = files_under(root(), &[""])
        .iter()
        .filter_map(|file| file.strip_prefix(root()).ok())
        .map(|file| file.display().to_string())
        .collect();
    let dirs: BTreeSet<String> = files
        .iter()
        .flat_map(|file| {
            let parts: Vec<&str> = file.split('/').collect();
            let mut prefixes = Vec::new();
            for end in 1..parts.len() {
                for start in 0..end {
                    prefixes.push(format!("{}/", parts[start..end].join("/")));
                }
            }
            prefixes
        })
        .collect();
    let words = identifiers();
    let mut problems = Vec::new();
    for quoted in text.split('`').skip(1).step_by(2) {
        // A store key prefix (`s/`, `o/{owner}/`) is not a path.
        let is_path = !quoted.starts_with('/')
            && quoted.split('/').next().is_some_and(|first| first.len() > 1)
            && quoted.contains('/')
            && quoted.chars().all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c));
        // Build output (`target/…`) is made by the build, not kept in the tree.
        if is_path && !quoted.starts_with("target/") {
            let exists = dirs.contains(&format!("{}/", quoted.trim_end_matches('/')))
                || files
                    .iter()
                    .any(|file| file == quoted || file.ends_with(&format!("/{quoted}")));
            if !exists {
                problems.push(format!("the path `{quoted}` names no file or directory"));
            }
            continue;
        }
        // A Rust path (`a::b::C`, `Type::method`) or a type name: each of its segments
        // must be an identifier somewhere in the sources.
        let name = quoted.trim_end_matches("()");
        let rust_path = name.contains("::")
            && name
                .split("::")
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_'));
        let type_name = name.len() > 2
            && name.starts_with(|c: char| c.is_ascii_uppercase())
            && name.chars().any(|c| c.is_ascii_lowercase())
            && name.chars().all(|c| c.is_ascii_alphanumeric());
        if rust_path || type_name {
            let unknown = name
                .split("::")
                .any(|part| !matches!(part, "crate" | "self" | "super") && !words.contains(part));
            if unknown {
                problems.push(format!("`{quoted}` names nothing in the sources"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/ARCHITECTURE.md drifted:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_catalog_gpu_has_its_row_in_the_fleet_docs() {
    let text = read(&root().join("docs/fleets.md"));
    let rows: HashMap<String, Vec<String>> = text
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().trim_matches('`').to_string())
                .collect();
            (cells[0].clone(), cells)
        })
        .collect();
    let mut problems = Vec::new();
    for card in skein_gpu_catalog::CARDS {
        match rows.get(card.name) {
            None => problems.push(format!(
                "{} is in the catalog but has no row in docs/fleets.md",
                card.name
            )),
            Some(cells) => {
                let memory = card.memory_mib;
                if cells.get(1).map(String::as_str) != Some(card.nvml_name) || cells.get(2) != Some(&memory.to_string())
                {
                    problems.push(format!(
                        "the row of {} in docs/fleets.md ({cells:?}) does not say NVML name {:?} and {memory} MiB",
                        card.name, card.nvml_name
                    ));
                }
            }
        }
    }
    let known: BTreeSet<&str> = skein_gpu_catalog::CARDS.iter().map(|card| card.name).collect();
    for name in rows.keys() {
        let is_card_row = name.contains(|c: char| c.is_ascii_digit()) && name.chars().any(|c| c.is_ascii_uppercase());
        if is_card_row && !known.contains(name.as_str()) {
            problems.push(format!("docs/fleets.md has a row for {name}, which the catalog lacks"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/fleets.md drifted from the GPU catalog:\n{}",
        problems.join("\n")
    );
}

/// The source files the size rule covers: crate sources, benches and the page's scripts;
/// not tests (`tests/` directories, `tests.rs` modules) nor vendored code.
fn sources() -> Vec<PathBuf> {
    let mut dirs = vec![root().join("fuzz"), root().join("web")];
    for member in members() {
        dirs.push(member.dir.join("src"));
        dirs.push(member.dir.join("benches"));
    }
    dirs.iter()
        .flat_map(|dir| files_under(dir, &[".rs", ".js", ".mjs"]))
        .filter(|file| {
            let relative = file.strip_prefix(root()).unwrap_or(file).display().to_string();
            !relative.split('/').any(|part| part == "tests" || part == "vendor") && !relative.ends_with("/tests.rs")
        })
        .collect()
}

#[test]
fn no_source_file_is_over_the_limit() {
    let long: Vec<String> = sources()
        .iter()
        .filter_map(|file| {
            let lines = read(file).lines().count();
            (lines > MAX_LINES)
                .then(|| format!("{}: {lines} lines", file.strip_prefix(root()).unwrap_or(file).display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (split them along their seams; move a big `mod tests` into a sibling `tests.rs`):\n{}",
        long.join("\n")
    );
}

/// A crate's modules by path (`["run", "executor"]`), each with its file.
fn module_files(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    files_under(src, &[".rs"])
        .into_iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(src).ok()?.with_extension("");
            let mut path: Vec<String> = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if path.first().is_some_and(|first| first == "bin") {
                return None;
            }
            if matches!(path.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                path.pop();
            }
            Some((path, file))
        })
        .collect()
}

/// A file's text without comments and without its inline test module.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or(text);
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand_use(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        out.push(format!("{prefix}{tree}"));
        return;
    };
    let head = format!("{prefix}{}", &tree[..open]);
    let body = tree[open + 1..].strip_suffix('}').unwrap_or(&tree[open + 1..]);
    let (mut depth, mut start) = (0, 0);
    for (at, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand_use(&body[start..at], &head, out);
                start = at + 1;
            }
            _ => {}
        }
    }
    if !body[start..].trim().is_empty() {
        expand_use(&body[start..], &head, out);
    }
}

/// The module paths a file refers to through `crate::`, `super::` and `self::`.
fn references(module: &[String], code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let compact: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    for statement in compact.split("use").skip(1) {
        let statement = statement.split(';').next().unwrap_or("");
        if statement.starts_with("crate::") || statement.starts_with("super::") || statement.starts_with("self::") {
            expand_use(statement, "", &mut paths);
        }
    }
    let bytes = compact.as_bytes();
    for keyword in ["crate::", "super::"] {
        for (at, _) in compact.match_indices(keyword) {
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let end = compact[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(compact.len(), |end| at + end);
            paths.push(compact[at..end].to_string());
        }
    }
    paths
        .into_iter()
        .map(|path| {
            let mut base: Vec<String> = module.to_vec();
            let mut parts = path.split("::").filter(|part| !part.is_empty()).peekable();
            if parts.peek() == Some(&"crate") {
                base.clear();
                parts.next();
            }
            while let Some(&part) = parts.peek() {
                match part {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                parts.next();
            }
            base.extend(parts.map(str::to_string));
            base
        })
        .collect()
}

/// For every module of the crate at `src`, the circles among its direct children: child
/// A depends on child B when a file under A names something under B.
fn circles(src: &Path) -> Vec<Vec<String>> {
    let modules = module_files(src);
    let mut edges: BTreeSet<(Vec<String>, Vec<String>)> = BTreeSet::new();
    // A test module may use anything: it is not part of the crate's structure.
    for (module, file) in modules
        .iter()
        .filter(|(module, _)| module.last().is_none_or(|last| last != "tests"))
    {
        for mut target in references(module, &code_of(&read(file))) {
            while !target.is_empty() && !modules.contains_key(&target) {
                target.pop();
            }
            edges.insert((module.clone(), target));
        }
    }
    let mut found = Vec::new();
    for parent in modules.keys() {
        let children: Vec<&Vec<String>> = modules
            .keys()
            .filter(|child| child.len() == parent.len() + 1 && child.starts_with(parent))
            .collect();
        let child_of = |module: &Vec<String>| children.iter().position(|child| module.starts_with(child));
        let mut graph = vec![BTreeSet::new(); children.len()];
        for (from, to) in &edges {
            if let (Some(a), Some(b)) = (child_of(from), child_of(to))
                && a != b
            {
                graph[a].insert(b);
            }
        }
        for component in strongly_connected(&graph) {
            found.push(component.iter().map(|&index| children[index].join("::")).collect());
        }
    }
    found
}

/// The strongly connected components of more than one vertex (Tarjan).
fn strongly_connected(graph: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct Search<'a> {
        graph: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    impl Search<'_> {
        fn visit(&mut self, vertex: usize) {
            self.index[vertex] = Some(self.next);
            self.low[vertex] = self.next;
            self.next += 1;
            self.stack.push(vertex);
            self.on_stack[vertex] = true;
            for &next in self.graph[vertex].iter() {
                match self.index[next] {
                    None => {
                        self.visit(next);
                        self.low[vertex] = self.low[vertex].min(self.low[next]);
                    }
                    Some(index) if self.on_stack[next] => self.low[vertex] = self.low[vertex].min(index),
                    Some(_) => {}
                }
            }
            if Some(self.low[vertex]) == self.index[vertex] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack[top] = false;
                    component.push(top);
                    if top == vertex {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: vec![None; graph.len()],
        low: vec![0; graph.len()],
        stack: Vec::new(),
        on_stack: vec![false; graph.len()],
        next: 0,
        found: Vec::new(),
    };
    for vertex in 0..graph.len() {
        if search.index[vertex].is_none() {
            search.visit(vertex);
        }
    }
    search.found
}

#[test]
fn no_module_imports_its_siblings_in_a_circle() {
    let mut problems = Vec::new();
    for member in members() {
        let src = member.dir.join("src");
        for circle in circles(&src) {
            problems.push(format!("{}: {}", member.name, circle.join(" ⇄ ")));
        }
    }
    assert!(
        problems.is_empty(),
        "sibling modules that import each other in a circle (move what both need into a lower module):\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_circle_check_sees_a_circle() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").expect("lib.rs");
    fs::write(src.join("a.rs"), "use crate::b::{Thing, other::More};\n").expect("a.rs");
    fs::write(src.join("b.rs"), "pub struct Thing;\nfn f() { super::a::g(); }\n").expect("b.rs");
    fs::write(src.join("c.rs"), "use crate::a;\n").expect("c.rs");
    assert_eq!(circles(src), vec![vec!["a".to_string(), "b".to_string()]]);
    fs::write(src.join("b.rs"), "pub struct Thing;\n").expect("b.rs");
    assert!(circles(src).is_empty());
}
