//! The floors of the house, lowest first. A module may use its own floor and
//! the floors below it, never one above; the test below reads `src/` and fails
//! on an upward import. `ARCHITECTURE.md` draws the same table.

/// `(floor, the top-level modules on it)`, lowest first. Modules on one line
/// share a floor.
pub const FLOORS: &[(&str, &[&str])] = &[
    ("core", &["core"]),
    ("store", &["store"]),
    ("bus", &["bus"]),
    ("providers", &["providers"]),
    ("pipeline", &["pipeline"]),
    ("service", &["service"]),
    ("jobs", &["jobs"]),
    ("app", &["app"]),
    ("bench_recall", &["bench_recall"]),
    ("edges", &["api", "mcp", "cli"]),
];

/// The floor index of a top-level module (`main` and `cli` are the binary's).
pub fn floor_of(module: &str) -> Option<usize> {
    let module = if module == "main" { "cli" } else { module };
    FLOORS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every top-level module a line of Rust names through `crate::` (or
    /// `loomem::` in the binary), including `crate::{a, b}` groups.
    fn named_modules(line: &str, root: &str) -> Vec<String> {
        let mut out = Vec::new();
        let pat = format!("{root}::");
        let mut rest = line;
        while let Some(i) = rest.find(&pat) {
            let before = rest[..i].chars().last();
            rest = &rest[i + pat.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let name: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.push(name);
                    }
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        }
        out
    }

    #[test]
    fn named_modules_reads_paths_and_groups() {
        assert_eq!(
            named_modules("use crate::store::Store;", "crate"),
            vec!["store"]
        );
        assert_eq!(
            named_modules("use crate::{bus::Bus, core::Caller};", "crate"),
            vec!["bus", "core"]
        );
        assert_eq!(
            named_modules(
                "let x = loomem::app::Engine::start(); crate::jobs::x",
                "loomem"
            ),
            vec!["app"]
        );
        assert!(named_modules("mycrate::x", "crate").is_empty());
    }

    #[test]
    fn every_top_level_module_has_a_floor() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            if name == "lib" || name == "floors" {
                continue;
            }
            assert!(floor_of(&name).is_some(), "src/{name} is on no floor");
        }
    }

    /// Lance predicates are written in `store` only (`store::Filter`); a
    /// service never hands the store a SQL string.
    #[test]
    fn no_lance_predicate_is_written_outside_the_store() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut found = Vec::new();
        for file in &files {
            let rel = file.strip_prefix(&src).unwrap();
            if rel.starts_with("store") || rel == Path::new("floors.rs") {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            // Test modules may assert on a rendered filter.
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (n, line) in code.lines().enumerate() {
                for pattern in [".only_if(", "superseded_by IS", "arrow_cast("] {
                    if line.contains(pattern) {
                        found.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "predicates outside the store:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn no_module_imports_a_floor_above_its_own() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut upward = Vec::new();
        for file in &files {
            let rel = file.strip_prefix(&src).unwrap();
            let top = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string();
            let Some(own) = floor_of(&top) else {
                continue;
            };
            // The binary (main.rs, cli.rs) reaches the library as `loomem::`.
            let root = if top == "main" || top == "cli" {
                "loomem"
            } else {
                "crate"
            };
            let text = std::fs::read_to_string(file).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for module in named_modules(line, root) {
                    if let Some(floor) = floor_of(&module) {
                        if floor > own {
                            upward.push(format!(
                                "{}:{}: {} ({}) uses {} ({})",
                                rel.display(),
                                n + 1,
                                top,
                                FLOORS[own].0,
                                module,
                                FLOORS[floor].0
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            upward.is_empty(),
            "imports that reach up a floor:\n{}",
            upward.join("\n")
        );
    }
}
