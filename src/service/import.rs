//! Bulk import: read a file in one of the supported formats, validate every
//! record (a bad one is rejected with its line, the rest go on), and publish
//! the batch onto the bus without waiting for storage. Ids derive from the
//! source, so re-running an interrupted import resumes without duplicates.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::bus::Bus;
use crate::core::error::{Error, Result};
use crate::core::model::Chunk;
use crate::core::time::parse_instant_str;
use crate::core::{Caller, IdKey};
use crate::pipeline::worker::envelopes;
use crate::service::memory::{chunk_from_request, StoreRequest};

/// Records published per bus call.
const PUBLISH_CHUNK: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One `/v1/store` object per line, with an optional `id`.
    Jsonl,
    /// The LongMemEval JSON format: every haystack turn becomes a memory.
    Longmemeval,
    /// Paragraphs and list items become memories; headings become titles.
    Markdown,
    /// A lossless `loomem export` (JSONL form), restored row for row
    /// ([`crate::service::export::restore`]), not run through a pipeline.
    #[serde(rename = "loomem-jsonl")]
    LoomemJsonl,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "jsonl" => Ok(Format::Jsonl),
            "longmemeval" => Ok(Format::Longmemeval),
            "markdown" | "md" => Ok(Format::Markdown),
            "loomem-jsonl" => Ok(Format::LoomemJsonl),
            _ => Err(format!(
                "unknown format `{s}`; use jsonl, longmemeval, markdown or loomem-jsonl"
            )),
        }
    }
}

/// A record that was not imported, and why.
#[derive(schemars::JsonSchema, Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Rejected {
    /// 1-based line (jsonl, markdown) or 0-based entry index (longmemeval).
    pub line: usize,
    pub error: String,
}

#[derive(schemars::JsonSchema, Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImportReport {
    pub read: usize,
    pub accepted: usize,
    /// Records whose id was already in this file, or that the bus already
    /// holds and that are stored.
    pub duplicates: usize,
    pub rejected: Vec<Rejected>,
}

/// Records parsed from a file, before publishing.
pub struct Parsed {
    pub chunks: Vec<Chunk>,
    /// The line (or entry) each of `chunks` came from.
    pub lines: Vec<usize>,
    pub read: usize,
    pub rejected: Vec<Rejected>,
}

/// Parse `text` in `format`; records without a stream go to `stream`; ids
/// not given are derived with `ids` from the record's stream and place.
pub fn parse(
    format: Format,
    text: &str,
    stream: Option<&str>,
    caller: &Caller,
    ids: &IdKey,
) -> Result<Parsed> {
    let mut parsed = Parsed {
        chunks: Vec::new(),
        lines: Vec::new(),
        read: 0,
        rejected: Vec::new(),
    };
    let mut add =
        |line: usize, req: Result<StoreRequest>, id: &dyn Fn(&str, &StoreRequest) -> String| {
            parsed.read += 1;
            let result = req.and_then(|mut req| {
                if req.stream.is_none() {
                    req.stream = stream.map(str::to_string);
                }
                let s = caller.resolve_stream(req.stream.as_deref())?;
                if req.id.is_none() {
                    req.id = Some(id(&s, &req));
                }
                chunk_from_request(caller, req)
            });
            match result {
                Ok(c) => {
                    parsed.chunks.push(c);
                    parsed.lines.push(line);
                }
                Err(e) => parsed.rejected.push(Rejected {
                    line,
                    error: e.to_string(),
                }),
            }
        };
    match format {
        Format::LoomemJsonl => {
            return Err(Error::invalid(
                "format",
                "a loomem-jsonl export is restored, not parsed into new memories",
            ))
        }
        Format::Jsonl => {
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let req = crate::core::error::parse_json::<StoreRequest>(line.as_bytes());
                add(i + 1, req, &|s, r| {
                    ids.derive(&[
                        s,
                        "jsonl",
                        &(i + 1).to_string(),
                        &crate::core::model::content_hash(&r.content),
                    ])
                });
            }
        }
        Format::Markdown => {
            for (line, title, content) in markdown_blocks(text) {
                let req = StoreRequest {
                    content,
                    title,
                    source: Some("markdown-import".into()),
                    ..Default::default()
                };
                add(line, Ok(req), &|s, r| {
                    ids.derive(&[s, "markdown", &crate::core::model::content_hash(&r.content)])
                });
            }
        }
        Format::Longmemeval => {
            let entries: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|e| {
                Error::invalid("body", format!("not a LongMemEval JSON array: {e}"))
            })?;
            for (index, entry) in entries.iter().enumerate() {
                match longmemeval_turns(entry) {
                    Ok(turns) => {
                        for t in turns {
                            let (sid, ti) = (t.session_id.clone(), t.turn_index.to_string());
                            add(index, Ok(t.to_request()), &|s, _| {
                                ids.derive(&[s, "longmemeval", &sid, &ti])
                            });
                        }
                    }
                    Err(e) => add(index, Err(Error::invalid("entry", e)), &|_, _| {
                        String::new()
                    }),
                }
            }
        }
    }
    Ok(parsed)
}

impl Parsed {
    /// Reject, by line, every record whose id names a memory of another
    /// stream or an immutable one (an id chosen in the file), so that nothing
    /// of that line is written; the pipeline's `write` stage refuses such a
    /// record too, but only this check can tell the importer which line it was.
    pub async fn refuse_taken_ids(&mut self, store: &crate::store::Store) -> Result<()> {
        let owners = store
            .owners(&self.chunks.iter().map(|c| &c.id).collect::<Vec<_>>())
            .await?;
        if owners.is_empty() {
            return Ok(());
        }
        let (chunks, lines) = (
            std::mem::take(&mut self.chunks),
            std::mem::take(&mut self.lines),
        );
        for (c, line) in chunks.into_iter().zip(lines) {
            if let Some(why) = owners.get(&c.id).and_then(|o| o.refuses(&c)) {
                self.rejected.push(Rejected {
                    line,
                    error: format!("id: {why}"),
                });
            } else {
                self.chunks.push(c);
                self.lines.push(line);
            }
        }
        self.rejected.sort_by_key(|r| r.line);
        Ok(())
    }
}

/// Publish parsed records onto the bus (accepted, not waited for), calling
/// `progress(done, total)` after each chunk. With the `store`, a record the
/// bus drops as already held but that is not stored is sent again (see
/// [`crate::service::memory::publish_fresh`]).
pub async fn publish(
    bus: &Bus,
    store: Option<&crate::store::Store>,
    parsed: Parsed,
    mut progress: impl FnMut(usize, usize),
) -> Result<ImportReport> {
    let mut report = ImportReport {
        read: parsed.read,
        rejected: parsed.rejected,
        ..Default::default()
    };
    let mut seen = HashSet::new();
    let mut unique = Vec::with_capacity(parsed.chunks.len());
    for c in parsed.chunks {
        if seen.insert(c.id.clone()) {
            unique.push(c);
        } else {
            report.duplicates += 1;
        }
    }
    let total = unique.len();
    let mut done = 0;
    let mut rest = unique.into_iter().peekable();
    while rest.peek().is_some() {
        let chunk: Vec<Chunk> = rest.by_ref().take(PUBLISH_CHUNK).collect();
        let n = chunk.len();
        let dup =
            crate::service::memory::publish_fresh(bus, store, envelopes("import", chunk, false))
                .await?
                .len();
        report.accepted += n - dup;
        report.duplicates += dup;
        done += n;
        progress(done, total);
    }
    Ok(report)
}

/// One conversation turn of a LongMemEval haystack.
pub struct Turn {
    pub session_id: String,
    pub turn_index: usize,
    pub role: String,
    pub content: String,
    pub date: Option<String>,
    pub has_answer: bool,
}

impl Turn {
    /// The `/v1/store` request this turn becomes.
    pub fn to_request(&self) -> StoreRequest {
        let at = self
            .date
            .as_deref()
            .and_then(parse_longmemeval_date)
            .map(|m| serde_json::json!(m as f64 / 1e6));
        StoreRequest {
            content: format!("{}: {}", self.role, self.content),
            session_id: Some(self.session_id.clone()),
            source: Some("longmemeval".into()),
            memory_type: Some("observation".into()),
            metadata: Some(serde_json::json!({
                "session_id": self.session_id,
                "turn_index": self.turn_index,
                "role": self.role,
                "has_answer": self.has_answer,
                "session_date": self.date,
            })),
            valid_from: at.clone(),
            created_at: at,
            ..Default::default()
        }
    }
}

/// `2023/05/30 (Tue) 23:40` → microseconds, UTC.
pub fn parse_longmemeval_date(s: &str) -> Option<i64> {
    let cleaned: String = match (s.find('('), s.find(')')) {
        (Some(a), Some(b)) if b > a => format!("{}{}", &s[..a], &s[b + 1..]),
        _ => s.to_string(),
    };
    let cleaned = cleaned.split_whitespace().collect::<Vec<_>>().join(" ");
    parse_instant_str(&cleaned)
}

/// Every turn of one LongMemEval entry, or why the entry is malformed.
pub fn longmemeval_turns(entry: &serde_json::Value) -> Result<Vec<Turn>, String> {
    let sessions = entry["haystack_sessions"]
        .as_array()
        .ok_or("missing haystack_sessions array")?;
    let ids = entry["haystack_session_ids"]
        .as_array()
        .ok_or("missing haystack_session_ids array")?;
    let dates = entry["haystack_dates"].as_array();
    if ids.len() != sessions.len() {
        return Err(format!(
            "{} haystack_session_ids for {} haystack_sessions",
            ids.len(),
            sessions.len()
        ));
    }
    let mut out = Vec::new();
    for (si, (session, id)) in sessions.iter().zip(ids).enumerate() {
        let id = id
            .as_str()
            .ok_or(format!("haystack_session_ids[{si}] is not a string"))?;
        let turns = session
            .as_array()
            .ok_or(format!("haystack_sessions[{si}] is not an array"))?;
        let date = dates
            .and_then(|d| d.get(si))
            .and_then(|d| d.as_str())
            .map(str::to_string);
        for (ti, turn) in turns.iter().enumerate() {
            let role = turn["role"]
                .as_str()
                .ok_or(format!("haystack_sessions[{si}][{ti}] has no role"))?;
            let content = turn["content"]
                .as_str()
                .ok_or(format!("haystack_sessions[{si}][{ti}] has no content"))?;
            if content.trim().is_empty() {
                continue;
            }
            out.push(Turn {
                session_id: id.to_string(),
                turn_index: ti,
                role: role.to_string(),
                content: content.to_string(),
                date: date.clone(),
                has_answer: turn["has_answer"].as_bool().unwrap_or(false),
            });
        }
    }
    Ok(out)
}

/// (1-based line, current heading, text) for each paragraph or list item.
fn markdown_blocks(text: &str) -> Vec<(usize, Option<String>, String)> {
    let mut out = Vec::new();
    let mut heading: Option<String> = None;
    let mut para: Vec<&str> = Vec::new();
    let mut para_line = 0;
    let flush = |para: &mut Vec<&str>, line: usize, heading: &Option<String>, out: &mut Vec<_>| {
        if !para.is_empty() {
            out.push((line, heading.clone(), para.join(" ")));
            para.clear();
        }
    };
    let mut in_code = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with("```") {
            in_code = !in_code;
            flush(&mut para, para_line, &heading, &mut out);
            continue;
        }
        if in_code {
            continue;
        }
        if line.is_empty() {
            flush(&mut para, para_line, &heading, &mut out);
        } else if let Some(h) = line.strip_prefix('#') {
            flush(&mut para, para_line, &heading, &mut out);
            heading = Some(h.trim_start_matches('#').trim().to_string()).filter(|h| !h.is_empty());
        } else if let Some(item) = list_item(line) {
            flush(&mut para, para_line, &heading, &mut out);
            out.push((i + 1, heading.clone(), item.to_string()));
        } else {
            if para.is_empty() {
                para_line = i + 1;
            }
            para.push(line);
        }
    }
    flush(&mut para, para_line, &heading, &mut out);
    out
}

fn list_item(line: &str) -> Option<&str> {
    for p in ["- ", "* ", "+ "] {
        if let Some(rest) = line.strip_prefix(p) {
            return Some(rest.trim()).filter(|r| !r.is_empty());
        }
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && line[digits..].starts_with(". ") {
        return Some(line[digits + 2..].trim()).filter(|r| !r.is_empty());
    }
    None
}

/// Where an import goes: records that run through the pipeline go on the
/// bus; a lossless restore writes the store. An edge that has only one of them
/// (the CLI) passes the one its format needs.
#[derive(Clone, Copy)]
pub struct Destination<'a> {
    pub bus: Option<&'a Bus>,
    pub store: Option<&'a crate::store::Store>,
    /// The deployment's key for the ids of records that bring none.
    pub ids: &'a IdKey,
}

impl<'a> Destination<'a> {
    /// A running engine's bus and store.
    pub fn services(s: &'a crate::service::Services) -> Destination<'a> {
        Destination {
            bus: Some(&s.bus),
            store: Some(&s.store),
            ids: &s.ids,
        }
    }
}

/// Import `text` in `format` for `caller` (`POST /v1/import`, `loomem import`):
/// parse and publish, or restore a lossless export; scoped to the caller's
/// streams. `progress` sees (accepted, total) as publishing goes.
pub async fn import_text(
    to: Destination<'_>,
    caller: &Caller,
    format: Format,
    stream: Option<&str>,
    text: &str,
    progress: impl FnMut(usize, usize),
) -> Result<ImportReport> {
    let missing = |what: &str| Error::Unavailable(format!("this import needs the {what}"));
    if format == Format::LoomemJsonl {
        let store = to.store.ok_or_else(|| missing("data directory"))?;
        return crate::service::export::restore(store, caller, text).await;
    }
    let bus = to.bus.ok_or_else(|| missing("bus"))?;
    let mut parsed = parse(format, text, stream, caller, to.ids)?;
    if let Some(store) = to.store {
        parsed.refuse_taken_ids(store).await?;
    }
    publish(bus, to.store, parsed, progress).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admin() -> Caller {
        Caller::admin("t")
    }

    #[test]
    fn jsonl_rejects_bad_lines_by_number_and_derives_stable_ids() {
        let text = "{\"content\":\"first\"}\n\n{\"content\": 5}\nnot json\n{\"content\":\"second\",\"id\":\"mine\"}\n";
        let p = parse(
            Format::Jsonl,
            text,
            Some("s"),
            &admin(),
            &IdKey::from_secret(b"t"),
        )
        .unwrap();
        assert_eq!(p.read, 4);
        assert_eq!(p.chunks.len(), 2);
        assert_eq!(
            p.rejected.iter().map(|r| r.line).collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert!(
            p.rejected[0].error.starts_with("content:"),
            "{:?}",
            p.rejected
        );
        assert_eq!(p.chunks[1].id, "mine");
        let again = parse(
            Format::Jsonl,
            text,
            Some("s"),
            &admin(),
            &IdKey::from_secret(b"t"),
        )
        .unwrap();
        assert_eq!(again.chunks[0].id, p.chunks[0].id);
        assert_eq!(p.chunks[0].stream, "s");
    }

    #[test]
    fn longmemeval_turns_keep_session_and_date() {
        let entry = serde_json::json!([{
            "question_id": "q1",
            "haystack_session_ids": ["s1", "s2"],
            "haystack_dates": ["2023/05/30 (Tue) 23:40", "2023/06/01 (Thu) 08:00"],
            "haystack_sessions": [
                [{"role": "user", "content": "I adopted a cat named Miso.", "has_answer": true},
                 {"role": "assistant", "content": "Congratulations!"}],
                [{"role": "user", "content": "Any tips for the garden?"}]
            ]
        }, {"question_id": "broken"}]);
        let p = parse(
            Format::Longmemeval,
            &entry.to_string(),
            Some("bench"),
            &admin(),
            &IdKey::from_secret(b"t"),
        )
        .unwrap();
        assert_eq!(p.chunks.len(), 3);
        assert_eq!(p.rejected.len(), 1);
        assert_eq!(p.rejected[0].line, 1);
        let c = &p.chunks[0];
        assert_eq!(c.content, "user: I adopted a cat named Miso.");
        assert_eq!(c.session_id.as_deref(), Some("s1"));
        assert_eq!(
            crate::core::time::to_rfc3339(c.created_at),
            "2023-05-30T23:40:00Z"
        );
        assert_eq!(c.valid_from, Some(c.created_at));
        let meta: serde_json::Value = serde_json::from_str(c.metadata.as_deref().unwrap()).unwrap();
        assert_eq!(meta["has_answer"], true);
        assert_eq!(meta["turn_index"], 0);
    }

    #[test]
    fn markdown_paragraphs_and_items_become_memories() {
        let text = "# Preferences\n\n- Likes green tea\n- Hates mornings\n\nWorks on the\nBilling project.\n\n```\ncode\n```\n";
        let p = parse(
            Format::Markdown,
            text,
            Some("s"),
            &admin(),
            &IdKey::from_secret(b"t"),
        )
        .unwrap();
        let contents: Vec<&str> = p.chunks.iter().map(|c| c.content.as_str()).collect();
        assert_eq!(
            contents,
            vec![
                "Likes green tea",
                "Hates mornings",
                "Works on the Billing project."
            ]
        );
        assert_eq!(p.chunks[0].title.as_deref(), Some("Preferences"));
    }

    #[test]
    fn longmemeval_dates_parse() {
        let m = parse_longmemeval_date("2023/05/30 (Tue) 23:40").unwrap();
        assert_eq!(crate::core::time::to_rfc3339(m), "2023-05-30T23:40:00Z");
    }
}
