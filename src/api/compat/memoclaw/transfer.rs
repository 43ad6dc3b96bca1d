//! MemoClaw's export, import and markdown migration.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::*;
use crate::core::model::hex;

// ---------------------------------------------------------------- export

/// `GET /v1/export`: the memories matching the filters as a JSON array of
/// memory objects (what `POST /v1/import` reads), CSV or Markdown.
pub(super) async fn export(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiQuery(q): ApiQuery<ListParams>,
) -> Result<Response> {
    let format = q.format.clone().unwrap_or_else(|| "json".into());
    if !["json", "csv", "markdown"].contains(&format.as_str()) {
        return Err(Error::invalid(
            "format",
            format!("`{format}`: must be json, csv or markdown"),
        ));
    }
    let views = super::super::all(&engine, &caller, &q.query(&caller)?).await?;
    let memories: Vec<Value> = views.iter().map(|v| memory(&caller, v)).collect();
    let (content_type, body) = match format.as_str() {
        "json" => ("application/json", Value::Array(memories).to_string()),
        "csv" => ("text/csv; charset=utf-8", csv(&memories)),
        _ => ("text/markdown; charset=utf-8", markdown(&memories)),
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

const CSV_COLUMNS: &[&str] = &[
    "id",
    "content",
    "memory_type",
    "namespace",
    "importance",
    "tags",
    "pinned",
    "immutable",
    "session_id",
    "agent_id",
    "expires_at",
    "created_at",
    "updated_at",
];

fn csv(memories: &[Value]) -> String {
    let cell = |v: &Value| -> String {
        let s = match v {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            Value::Array(items) => strings(items, ";"),
            other => other.to_string(),
        };
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s
        }
    };
    let mut out = CSV_COLUMNS.join(",") + "\n";
    for m in memories {
        let row: Vec<String> = CSV_COLUMNS
            .iter()
            .map(|c| match *c {
                "tags" => cell(&m["metadata"]["tags"]),
                c => cell(&m[c]),
            })
            .collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

fn markdown(memories: &[Value]) -> String {
    let mut out = String::from("# Memories\n");
    for m in memories {
        let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
        out.push_str(&format!(
            "\n## {} · {} · {}\n\n{}\n\n- importance: {}\n- tags: {}\n- id: {}\n",
            s("namespace"),
            s("memory_type"),
            s("created_at"),
            s("content"),
            m["importance"],
            tag_list(m, ", "),
            s("id"),
        ));
    }
    out
}

/// The fields of an exported memory object that a store request takes.
const IMPORTED: &[&str] = &[
    "content",
    "metadata",
    "importance",
    "namespace",
    "memory_type",
    "session_id",
    "agent_id",
    "expires_at",
    "pinned",
    "immutable",
];

/// `POST /v1/import`: a JSON array of memory objects (as `GET /v1/export`
/// writes them). An object whose id is already stored is skipped, as is a
/// repeat of a stored memory; an object that cannot be stored is skipped and
/// named in `errors`. Ids and creation times are kept.
pub(super) async fn import(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJsonArray(items): ApiJsonArray,
) -> Result<Json<Value>> {
    const MAX_IMPORT: usize = 10_000;
    if items.len() > MAX_IMPORT {
        return Err(Error::invalid(
            "body",
            format!("at most {MAX_IMPORT} memories a request"),
        ));
    }
    let ids: Vec<&str> = items
        .iter()
        .filter_map(|item| item.get("id").and_then(Value::as_str))
        .collect();
    let stored = service::memory::visible_ids(&engine, &caller, &ids).await?;
    let mut errors: Vec<Value> = Vec::new();
    let mut skipped = 0;
    let mut requests = Vec::new();
    for (index, item) in items.into_iter().enumerate() {
        let Value::Object(obj) = item else {
            errors.push(json!({"index": index, "error": "not an object"}));
            continue;
        };
        let id = obj.get("id").and_then(Value::as_str).map(str::to_string);
        if id.as_ref().is_some_and(|id| stored.contains(id)) {
            skipped += 1;
            continue;
        }
        let fields: Map<String, Value> = obj
            .iter()
            .filter(|(k, v)| IMPORTED.contains(&k.as_str()) && !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let parsed = serde_json::from_value::<NewMemory>(Value::Object(fields))
            .map_err(|e| Error::invalid("memory", e.to_string()))
            .and_then(|m| store_request(&caller, m));
        match parsed {
            Ok(mut r) => {
                r.id = id;
                r.created_at = obj.get("created_at").cloned().filter(|v| !v.is_null());
                requests.push((index, r));
            }
            Err(e) => errors.push(json!({"index": index, "error": e.to_string()})),
        }
    }
    let mut imported = 0;
    for chunk in requests.chunks(500) {
        let batch: Vec<_> = chunk.iter().map(|(_, r)| r.clone()).collect();
        let done = store_all(&engine, &caller, batch).await?;
        // An id that is another memory's (in a stream this key cannot see,
        // or an immutable one): the memory is imported under a new id.
        let again: Vec<_> = done
            .conflicts
            .iter()
            .map(|&i| service::memory::StoreRequest {
                id: None,
                ..chunk[i].1.clone()
            })
            .collect();
        let retried = store_all(&engine, &caller, again).await?;
        imported += done.stored + retried.stored;
        skipped += done.duplicates + retried.duplicates;
        let index = |e: &Value| e["index"].as_u64().unwrap_or(0) as usize;
        let first = done
            .errors
            .iter()
            .filter(|e| !done.conflicts.contains(&index(e)))
            .map(|e| (index(e), e));
        let second = retried.errors.iter().map(|e| (done.conflicts[index(e)], e));
        for (at, e) in first.chain(second) {
            errors.push(json!({"index": chunk[at].0, "error": e["error"]}));
        }
    }
    skipped += errors.len();
    let mut out = json!({"imported": imported, "skipped": skipped});
    if !errors.is_empty() {
        out["errors"] = json!(errors);
    }
    Ok(Json(out))
}

// ---------------------------------------------------------------- migrate

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MarkdownFile {
    filename: String,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Migrate {
    files: Vec<MarkdownFile>,
    namespace: Option<String>,
}

/// The `YYYY-MM-DD` a file's name starts with (a daily note), if any.
fn file_date(filename: &str) -> Option<&str> {
    let stem = filename.rsplit('/').next().unwrap_or(filename);
    let date = stem.get(..10)?;
    crate::core::time::is_date_only(date)
        .then_some(date)
        .filter(|d| crate::core::time::parse_instant_str(d).is_some())
}

/// A markdown file's memories: one per `## ` section (with its heading), or
/// the whole file when it has none; shorter than 5 characters skipped, cut
/// at 8,000 characters.
fn sections(content: &str) -> Vec<(Option<String>, String)> {
    let mut out: Vec<(Option<String>, String)> = Vec::new();
    let mut heading: Option<String> = None;
    let mut body = String::new();
    let mut flush = |heading: &Option<String>, body: &str| {
        let text = match heading {
            Some(h) if body.trim().is_empty() => h.clone(),
            Some(h) => format!("{h}\n\n{}", body.trim()),
            None => body.trim().to_string(),
        };
        if text.chars().count() >= 5 {
            out.push((heading.clone(), text.chars().take(8000).collect()));
        }
    };
    for line in content.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            flush(&heading, &body);
            heading = Some(h.trim().to_string());
            body.clear();
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    flush(&heading, &body);
    out
}

/// MemoClaw's type and importance for a migrated section, from its words.
fn classify(text: &str, daily: bool) -> (&'static str, f64) {
    let t = text.to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| t.contains(w));
    if has(&[
        "correction",
        "actually,",
        "not true",
        "was wrong",
        "corrected",
    ]) {
        ("correction", 0.9)
    } else if has(&["decided", "decision", "we chose", "will use", "instead of"]) {
        ("decision", 0.9)
    } else if has(&["prefer", "likes ", "favorite", "favourite", "dislike"]) {
        ("preference", 0.8)
    } else if has(&["project", "deployed", "release", "milestone", "roadmap"]) {
        ("project", 0.7)
    } else if daily {
        ("observation", 0.6)
    } else {
        ("general", 0.5)
    }
}

/// A tag from a heading: lower-case words joined by `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// `POST /v1/migrate`: markdown files as memories (201). Each section is
/// stored with tags from its heading and the file's date (plus `migrated`
/// and `openclaw`), its type and importance from its words, created at the
/// file's date; a section whose SHA-256 is already stored in the namespace
/// (or earlier in the request) is counted as deduplicated.
pub(super) async fn migrate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    ApiJson(req): ApiJson<Migrate>,
) -> Result<(StatusCode, Json<Value>)> {
    if req.files.is_empty() || req.files.len() > 10 {
        return Err(Error::invalid("files", "1 to 10 files"));
    }
    let stream = stream_of(&caller, req.namespace.as_deref())?;
    let (mut processed, mut created, mut deduplicated) = (0, 0, 0);
    let mut errors = Vec::new();
    let mut hashes = HashSet::new();
    for file in req.files {
        let date = file_date(&file.filename).map(str::to_string);
        let found: Vec<_> = sections(&file.content)
            .into_iter()
            .map(|(heading, text)| {
                let hash = hex(&Sha256::digest(text.as_bytes()));
                let id = format!(
                    "mc-{}",
                    &hex(&Sha256::digest(format!("{stream}\n{text}").as_bytes()))[..32]
                );
                (heading, text, hash, id)
            })
            .collect();
        let ids: Vec<&str> = found.iter().map(|(_, _, _, id)| id.as_str()).collect();
        let stored = service::memory::visible_ids(&engine, &caller, &ids).await?;
        let mut requests = Vec::new();
        for (heading, text, hash, id) in found {
            if !hashes.insert(hash.clone()) || stored.contains(&id) {
                deduplicated += 1;
                continue;
            }
            let (memory_type, importance) = classify(&text, date.is_some());
            let mut tags: Vec<String> = heading.as_deref().map(slug).into_iter().collect();
            tags.extend(date.clone());
            tags.extend(["migrated".to_string(), "openclaw".to_string()]);
            tags.retain(|t| !t.is_empty());
            tags.dedup();
            tags.truncate(MAX_TAGS);
            let mut meta = Map::new();
            meta.insert("content_hash".into(), json!(hash));
            meta.insert("source_file".into(), json!(file.filename));
            requests.push(service::memory::StoreRequest {
                id: Some(id),
                content: text,
                stream: Some(stream.clone()),
                title: heading,
                tags,
                memory_type: Some(memory_type.into()),
                importance: Some((importance * IMPORTANCE_SCALE) as f32),
                metadata: Some(kept_metadata(meta, importance)),
                created_at: date.as_ref().map(|d| json!(d)),
                source: Some("migrate".into()),
                ..Default::default()
            });
        }
        match store_all(&engine, &caller, requests).await {
            Ok(done) if done.errors.is_empty() => {
                processed += 1;
                created += done.stored;
                deduplicated += done.duplicates;
            }
            Ok(done) => {
                created += done.stored;
                deduplicated += done.duplicates;
                errors.push(json!({"filename": file.filename, "error": done.errors[0]["error"]}));
            }
            Err(e) => errors.push(json!({"filename": file.filename, "error": e.to_string()})),
        }
    }
    let mut out = json!({
        "files_processed": processed,
        "memories_created": created,
        "memories_deduplicated": deduplicated,
    });
    if !errors.is_empty() {
        out["errors"] = json!(errors);
    }
    Ok((StatusCode::CREATED, Json(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_files_split_into_sections_with_their_headings() {
        let s = sections("## User preferences\n\nPrefers dark mode.\n\n## Project update\n\nDeployed v2.1.\n\n## x\n");
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].0.as_deref(), Some("User preferences"));
        assert_eq!(s[0].1, "User preferences\n\nPrefers dark mode.");
        assert_eq!(s[1].1, "Project update\n\nDeployed v2.1.");
        let whole = sections("Just a note without headers.");
        assert_eq!(
            whole,
            vec![(None, "Just a note without headers.".to_string())]
        );
        assert!(sections("hey").is_empty());
    }

    #[test]
    fn migrated_sections_get_memoclaws_types_and_importance() {
        assert_eq!(
            classify("Decided to use Postgres", false),
            ("decision", 0.9)
        );
        assert_eq!(classify("Prefers dark mode", false), ("preference", 0.8));
        assert_eq!(
            classify("Deployed v2.1 to production", false),
            ("project", 0.7)
        );
        assert_eq!(classify("Walked the dog", true), ("observation", 0.6));
        assert_eq!(classify("Walked the dog", false), ("general", 0.5));
        assert_eq!(file_date("2026-01-15.md"), Some("2026-01-15"));
        assert_eq!(file_date("decisions.md"), None);
        assert_eq!(slug("User preferences!"), "user-preferences");
    }

    #[test]
    fn csv_cells_are_quoted_when_they_must_be() {
        let m = json!({"id": "a", "content": "say \"hi\", then go", "metadata": {"tags": ["x", "y"]}, "importance": 0.5});
        let out = csv(&[m]);
        let row = out.lines().nth(1).unwrap();
        assert!(row.starts_with("a,\"say \"\"hi\"\", then go\","), "{row}");
        assert!(row.contains(",x;y,"), "{row}");
    }
}
