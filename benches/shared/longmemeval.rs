//! LongMemEval_S's text for the benches that want real turns and questions:
//! `../shared/datasets/longmemeval/` beside the project (or
//! `LOOMEM_WORKLOAD_DATA`), read as gzipped JSON lines through `zcat`.

use std::path::{Path, PathBuf};

pub fn data_dir() -> PathBuf {
    std::env::var_os("LOOMEM_WORKLOAD_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/datasets/longmemeval")
        })
}

/// The lines of a gzipped JSONL file.
fn jsonl_gz(path: &Path) -> Vec<serde_json::Value> {
    let out = std::process::Command::new("zcat")
        .arg(path)
        .output()
        .unwrap_or_else(|e| panic!("zcat {}: {e}", path.display()));
    assert!(out.status.success(), "zcat {} failed", path.display());
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Every session's non-empty turns in order, as (session, role, text).
pub fn turns() -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (s, session) in jsonl_gz(&data_dir().join("sessions.jsonl.gz"))
        .iter()
        .enumerate()
    {
        for t in session["turns"].as_array().into_iter().flatten() {
            let text = t["content"].as_str().unwrap_or_default().trim();
            if !text.is_empty() {
                let role = t["role"].as_str().unwrap_or_default();
                out.push((s, role.to_string(), text.to_string()));
            }
        }
    }
    out
}

/// The questions of LongMemEval_S, in the file's order.
pub fn questions() -> Vec<String> {
    jsonl_gz(&data_dir().join("s.questions.jsonl.gz"))
        .iter()
        .filter_map(|q| q["question"].as_str().map(str::to_string))
        .collect()
}
