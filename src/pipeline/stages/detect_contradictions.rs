//! `detect_contradictions`: a new memory that updates an earlier one about the
//! same subject supersedes it. Nothing is deleted: the old memory gets
//! `valid_until` and `superseded_by`, the new one `supersedes` and the next
//! `version`, and `history` records both sides with the reason.
//!
//! Updates are recognised without an LLM: an update cue ("switched from X to
//! Y", "now uses", "no longer", "instead of") plus an entity the old memory
//! named (X) or one of the same category (another editor), or the same
//! attribute slot ("my favorite color is …").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::future::BoxFuture;
use regex::Regex;
use serde::Deserialize;

use super::parse_params;
use crate::core::model::{now_micros, Chunk};
use crate::pipeline::{ensure_neighbors, BuildContext, PipelineError, Record, Stage};
use crate::providers::llm::{Llm, LlmError};
use crate::store::graph::{entity_key, Dictionary, DictionaryEntry};
use crate::store::{Filter, HistoryRow, Store};

/// A batch's candidate lookups by stream, subject, update keys and slot.
type Lookups = HashMap<(String, String, Vec<String>, Option<String>), Vec<Chunk>>;

const JUDGE_PROMPT: &str = "You keep a user's long-term memory consistent. Given a new memory and earlier memories about the same subject, say which earlier memories the new one makes outdated: they state something that is no longer true now that the new memory holds (a changed preference, a move, a new job, a changed plan or date). A memory that only adds detail, or is merely related, does not outdate anything. Return JSON {\"superseded\": [numbers of the outdated earlier memories], \"reason\": \"one short sentence\"}.";

fn judge_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["superseded", "reason"],
        "properties": {
            "superseded": {"type": "array", "items": {"type": "integer"}},
            "reason": {"type": "string"},
        },
    })
}

/// The earlier memories (by position in `olds`) a judgement names, and its reason.
fn judgement(answer: serde_json::Value, n: usize) -> Result<(BTreeSet<usize>, String), String> {
    #[derive(Deserialize)]
    struct Answer {
        superseded: Vec<i64>,
        #[serde(default)]
        reason: String,
    }
    let a: Answer = serde_json::from_value(answer).map_err(|e| format!("schema: {e}"))?;
    let picked = a
        .superseded
        .into_iter()
        .filter(|k| (1..=n as i64).contains(k))
        .map(|k| k as usize - 1)
        .collect();
    Ok((picked, excerpt(a.reason.trim())))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetectContradictionsConfig {
    /// The entity dictionary (for categories), relative to the pipelines directory.
    #[serde(default)]
    pub dictionary_file: Option<String>,
    /// Extra entries given inline.
    #[serde(default)]
    pub entity: Vec<DictionaryEntry>,
    /// Most earlier memories one new memory may supersede.
    #[serde(default = "default_max")]
    pub max_superseded: usize,
    /// With `[llm]` configured (`judge_contradictions = true`): when the rules
    /// see no update, ask the LLM whether the new memory makes one of its
    /// closest earlier memories about the same subject outdated.
    #[serde(default)]
    pub llm_judge: bool,
    /// Earlier memories shown to the judge: the closest ones at least this similar.
    #[serde(default = "default_judge_similarity")]
    pub judge_min_similarity: f32,
    #[serde(default = "default_judge_candidates")]
    pub judge_candidates: usize,
}

fn default_judge_similarity() -> f32 {
    0.6
}
fn default_judge_candidates() -> usize {
    3
}

fn default_max() -> usize {
    5
}

impl DetectContradictionsConfig {
    pub fn build(
        self,
        store: Arc<Store>,
        dir: &std::path::Path,
    ) -> Result<DetectContradictions, PipelineError> {
        let dictionary = Dictionary::load(dir, self.dictionary_file.as_deref(), self.entity)
            .map_err(|e| PipelineError::Config {
                stage: "detect_contradictions".into(),
                message: e.to_string(),
            })?;
        let mut by_category: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut category_of = BTreeMap::new();
        for entry in dictionary.by_key.values() {
            if let Some(cat) = &entry.category {
                let key = entity_key(&entry.name);
                by_category
                    .entry(cat.clone())
                    .or_default()
                    .insert(key.clone());
                category_of.insert(key, cat.clone());
            }
        }
        Ok(DetectContradictions {
            store,
            judge: None,
            judge_min_similarity: self.judge_min_similarity,
            judge_candidates: self.judge_candidates.max(1),
            max_superseded: self.max_superseded,
            by_category,
            category_of,
            from_to: Regex::new(r"(?i)\b(?:switched|switching|moved|moving|migrated|migrating|changed|changing|transitioned|went)\b[^.;!?]{0,20}?\bfrom\s+(?P<from>[^,.;!?]+?)\s+(?:to|for)\b")
                .expect("static regex"),
            cue: Regex::new(r"(?i)\b(?:switched|switching|moved|migrated|changed|transitioned)(?: over| back)? to\b|\bnow (?:use|uses|using|prefer|prefers|work|works|working|live|lives|drive|drives|run|runs)\b|\bno longer\b|\binstead of\b|\breplaced\b|\bnot anymore\b|\bthese days\b|\bnowadays\b|\bstopped using\b|\bgave up\b")
                .expect("static regex"),
            slot: Regex::new(r"(?i)\b(?:my|user'?s|the user'?s|his|her|their)\s+(favorite|favourite|preferred|current|new|main)\s+([a-z][a-z ]{1,30}?)\s+(?:is|are|was|has become|became)\b")
                .expect("static regex"),
        })
    }
}

pub fn build(params: toml::Table, ctx: &BuildContext) -> Result<Box<dyn Stage>, PipelineError> {
    let cfg: DetectContradictionsConfig = parse_params("detect_contradictions", params)?;
    let judge = ctx
        .llm
        .clone()
        .filter(|llm| cfg.llm_judge && llm.config().judge_contradictions);
    let mut stage = cfg.build(ctx.store.clone(), &ctx.dir)?;
    stage.judge = judge;
    Ok(Box::new(stage))
}

pub struct DetectContradictions {
    store: Arc<Store>,
    /// The LLM asked when the rules see no update.
    pub judge: Option<Arc<Llm>>,
    judge_min_similarity: f32,
    judge_candidates: usize,
    max_superseded: usize,
    by_category: BTreeMap<String, BTreeSet<String>>,
    category_of: BTreeMap<String, String>,
    from_to: Regex,
    cue: Regex,
    slot: Regex,
}

/// What a new memory would supersede: old memories of the same subject that
/// name one of `keys`, or that fill the same `slot`.
#[derive(Debug, Default, PartialEq)]
pub struct Update {
    pub cue: String,
    pub keys: BTreeSet<String>,
    pub slot: Option<String>,
}

/// Subjects alike but for case, as `str::to_lowercase` has them; ASCII
/// ones without lower-cased copies.
fn same_subject(a: &str, b: &str) -> bool {
    if a.is_ascii() && b.is_ascii() {
        a.eq_ignore_ascii_case(b)
    } else {
        a.to_lowercase() == b.to_lowercase()
    }
}

/// The first 120 chars of `s`, and an ellipsis when there were more.
fn excerpt(s: &str) -> String {
    match s.char_indices().nth(120) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

impl DetectContradictions {
    /// The update a memory announces, if any.
    pub fn update_of(&self, chunk: &Chunk) -> Option<Update> {
        let text = &chunk.content;
        let mut update = Update::default();
        let own: BTreeSet<&String> = chunk.entities.iter().collect();
        if let Some(caps) = self.from_to.captures(text) {
            update.cue = caps[0].trim().to_string();
            let from = &caps["from"];
            // Entities the "from" clause names: whole clause and each word.
            let from_key = entity_key(from);
            for e in &chunk.entities {
                if from_key.contains(e.as_str()) {
                    update.keys.insert(e.clone());
                }
            }
            for word in from.split_whitespace() {
                let k = entity_key(word);
                if !k.is_empty() && (self.category_of.contains_key(&k) || own.contains(&k)) {
                    update.keys.insert(k);
                }
            }
        }
        if let Some(m) = self.cue.find(text) {
            if update.cue.is_empty() {
                update.cue = m.as_str().to_string();
            }
            for e in &chunk.entities {
                if let Some(cat) = self.category_of.get(e) {
                    for other in &self.by_category[cat] {
                        if other != e && !own.contains(other) {
                            update.keys.insert(other.clone());
                        }
                    }
                }
            }
        }
        if let Some(caps) = self.slot.captures(text) {
            let slot = format!(
                "{} {}",
                caps[1].to_lowercase(),
                caps[2].trim().to_lowercase()
            );
            if update.cue.is_empty() {
                update.cue = format!("new value for {slot}");
            }
            update.slot = Some(slot);
        }
        (!update.keys.is_empty() || update.slot.is_some()).then_some(update)
    }

    /// May `new` supersede `old` at all: another live, mutable, not newer
    /// memory of the same stream and subject.
    ///
    /// The flags and times first: a batch asks this of every earlier record
    /// of the subject, and most were superseded already.
    fn may_replace(&self, new: &Chunk, old: &Chunk) -> bool {
        old.superseded_by.is_none()
            && !old.immutable
            && old.created_at <= new.created_at
            && old.id != new.id
            && old.stream == new.stream
            && match (old.subject.as_deref(), new.subject.as_deref()) {
                (Some(a), Some(b)) => same_subject(a, b),
                (a, b) => a == b,
            }
    }

    /// Does `old` hold what `update` (from `new`) replaces?
    fn replaces(&self, update: &Update, new: &Chunk, old: &Chunk) -> bool {
        self.may_replace(new, old)
            && (old.entities.iter().any(|e| update.keys.contains(e))
                || update
                    .slot
                    .as_ref()
                    .is_some_and(|s| old.content.to_lowercase().contains(s.as_str())))
    }

    /// Stored memories `update` may replace, before the per-record checks:
    /// current ones of `new`'s stream and subject that name one of its keys
    /// or fill its slot. A batch asks each distinct lookup once (`memo`): bulk
    /// imports repeat the same update about the same subject many times.
    async fn stored_candidates(
        &self,
        update: &Update,
        new: &Chunk,
        memo: &mut Lookups,
    ) -> Result<Vec<Chunk>, PipelineError> {
        let Some(subject) = &new.subject else {
            return Ok(Vec::new());
        };
        let key = (
            new.stream.clone(),
            subject.clone(),
            update.keys.iter().cloned().collect::<Vec<_>>(),
            update.slot.clone(),
        );
        if !memo.contains_key(&key) {
            let mut any: Vec<Filter> = update
                .keys
                .iter()
                .map(|k| Filter::new().mentions_key(k))
                .collect();
            if let Some(slot) = &update.slot {
                any.push(Filter::new().content_contains(slot));
            }
            let Some(any) = any.into_iter().reduce(Filter::or) else {
                return Ok(Vec::new());
            };
            let filter = Filter::new()
                .stream(&new.stream)
                .current()
                .subject(subject)
                .with(any);
            let found = self
                .store
                .find_rows(&filter, Some(self.max_superseded * 4 + 1))
                .await
                .map_err(|e| PipelineError::Batch {
                    stage: "detect_contradictions",
                    message: e.to_string(),
                })?;
            memo.insert(key.clone(), found);
        }
        Ok(memo[&key]
            .iter()
            .filter(|old| self.replaces(update, new, old))
            .cloned()
            .collect())
    }
}

/// Mark `old` as replaced by `new` and write both sides of the history, with
/// the update `cue` that gave it away as the reason.
fn supersede(new: &mut Chunk, old: &mut Chunk, cue: &str, history: &mut Vec<HistoryRow>) {
    let reason = format!(
        "{cue}: \"{}\" updates \"{}\"",
        excerpt(&new.content),
        excerpt(&old.content)
    );
    let now = now_micros();
    let from = *new.valid_from.get_or_insert(new.created_at);
    old.valid_until = Some(old.valid_until.map_or(from, |u| u.min(from)));
    old.superseded_by = Some(new.id.clone());
    old.updated_at = now;
    if new.version <= old.version {
        new.version = old.version + 1;
        new.supersedes = Some(old.id.clone());
    }
    for (chunk_id, event, related) in [
        (&old.id, "superseded", &new.id),
        (&new.id, "supersedes", &old.id),
    ] {
        history.push(HistoryRow {
            id: uuid::Uuid::new_v4().to_string(),
            stream: new.stream.clone(),
            chunk_id: chunk_id.clone(),
            event: event.into(),
            reason: reason.clone(),
            related_ids: vec![related.clone()],
            created_at: now,
        });
    }
}

impl DetectContradictions {
    /// Ask the judge about records the rules left alone: kept, with a subject,
    /// superseding nothing. Judge failures are logged and change nothing.
    async fn judge_batch(&self, llm: &Llm, batch: &mut [Record]) -> Result<(), PipelineError> {
        let pending: Vec<usize> = (0..batch.len())
            .filter(|&i| {
                let r = &batch[i];
                r.is_kept()
                    && r.chunk.subject.is_some()
                    && r.chunk.supersedes.is_none()
                    && self.update_of(&r.chunk).is_none()
            })
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        ensure_neighbors(&self.store, batch, self.judge_candidates).await?;
        let close: Vec<(usize, Vec<String>)> = pending
            .into_iter()
            .map(|i| {
                let ids = batch[i]
                    .neighbors
                    .iter()
                    .flatten()
                    .filter(|n| {
                        n.similarity >= self.judge_min_similarity && n.id != batch[i].chunk.id
                    })
                    .take(self.judge_candidates)
                    .map(|n| n.id.clone())
                    .collect();
                (i, ids)
            })
            .filter(|(_, ids): &(usize, Vec<String>)| !ids.is_empty())
            .collect();
        if close.is_empty() {
            return Ok(());
        }
        let all: Vec<String> = close
            .iter()
            .flat_map(|(_, ids)| ids.iter().cloned())
            .collect();
        let stored: BTreeMap<String, Chunk> = self
            .store
            .find(&Filter::new().ids(&all), None)
            .await
            .map_err(|e| PipelineError::Batch {
                stage: "detect_contradictions",
                message: e.to_string(),
            })?
            .into_iter()
            .map(|c| (c.id.clone(), c))
            .collect();
        let asks: Vec<(usize, Chunk, Vec<Chunk>)> = close
            .into_iter()
            .filter_map(|(i, ids)| {
                let new = &batch[i].chunk;
                let olds: Vec<Chunk> = ids
                    .iter()
                    .filter_map(|id| stored.get(id))
                    .filter(|old| self.may_replace(new, old))
                    .cloned()
                    .collect();
                (!olds.is_empty()).then(|| (i, new.clone(), olds))
            })
            .collect();
        use futures::StreamExt;
        let verdicts: Vec<(usize, Vec<Chunk>, String)> = futures::stream::iter(asks)
            .map(|(i, new, olds)| async move {
                let mut prompt = format!(
                    "New memory (recorded {}): {}\n\nEarlier memories:\n",
                    crate::core::time::to_rfc3339(new.created_at),
                    new.content
                );
                for (k, old) in olds.iter().enumerate() {
                    prompt.push_str(&format!(
                        "[{}] (recorded {}) {}\n",
                        k + 1,
                        crate::core::time::to_rfc3339(old.created_at),
                        old.content
                    ));
                }
                let reply = llm
                    .chat_json(&new.stream, "judge", JUDGE_PROMPT, &prompt, "contradiction_judgement", judge_schema())
                    .await;
                let verdict = match reply {
                    Ok(r) => judgement(r.json, olds.len()),
                    Err(LlmError::CapReached { .. }) => Ok((BTreeSet::new(), String::new())),
                    Err(e) => Err(e.to_string()),
                };
                match verdict {
                    Ok((picked, reason)) => {
                        let olds = olds
                            .into_iter()
                            .enumerate()
                            .filter(|(k, _)| picked.contains(k))
                            .map(|(_, c)| c)
                            .collect();
                        (i, olds, reason)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, memory = %new.id, "contradiction judge unavailable");
                        (i, Vec::new(), String::new())
                    }
                }
            })
            .buffer_unordered(4)
            .collect()
            .await;
        for (i, olds, reason) in verdicts {
            let r = &mut batch[i];
            for mut old in olds.into_iter().take(self.max_superseded) {
                let cue = format!("LLM judge ({reason})");
                supersede(&mut r.chunk, &mut old, &cue, &mut r.history);
                r.also_write.push(old);
            }
        }
        Ok(())
    }
}

impl Stage for DetectContradictions {
    fn name(&self) -> &'static str {
        "detect_contradictions"
    }

    fn process<'a>(&'a self, batch: &'a mut [Record]) -> BoxFuture<'a, Result<(), PipelineError>> {
        Box::pin(async move {
            let mut memo = Lookups::new();
            // The batch's records so far by stream and subject: only those can
            // be replaced (`may_replace`), where a bulk batch of thousands
            // asked every earlier record for each update.
            let mut by_subject: HashMap<(String, String), Vec<usize>> = HashMap::new();
            for i in 0..batch.len() {
                let Some(subject) = batch[i].chunk.subject.as_deref() else {
                    continue;
                };
                let key = (batch[i].chunk.stream.clone(), subject.to_lowercase());
                let update = match batch[i].is_kept() {
                    true => self.update_of(&batch[i].chunk),
                    false => None,
                };
                if let Some(update) = update {
                    let mut stored = self
                        .stored_candidates(&update, &batch[i].chunk, &mut memo)
                        .await?;
                    stored.truncate(self.max_superseded);
                    let (earlier, rest) = batch.split_at_mut(i);
                    let r = &mut rest[0];
                    for mut old in stored {
                        supersede(&mut r.chunk, &mut old, &update.cue, &mut r.history);
                        r.also_write.push(old);
                    }
                    for &j in by_subject.get(&key).into_iter().flatten() {
                        let e = &mut earlier[j];
                        if e.is_kept() && self.replaces(&update, &r.chunk, &e.chunk) {
                            supersede(&mut r.chunk, &mut e.chunk, &update.cue, &mut r.history);
                        }
                    }
                }
                by_subject.entry(key).or_default().push(i);
            }
            if let Some(llm) = &self.judge {
                self.judge_batch(llm, batch).await?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_is_the_first_120_chars() {
        let short = "é".repeat(120);
        assert_eq!(excerpt(&short), short);
        assert_eq!(excerpt(&format!("{short}x")), format!("{short}…"));
        assert_eq!(excerpt(""), "");
    }

    async fn stage() -> (DetectContradictions, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(tmp.path(), 8, 100).await.unwrap());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines");
        let cfg = DetectContradictionsConfig {
            dictionary_file: Some("dictionaries/entities.toml".into()),
            entity: vec![],
            max_superseded: 5,
            llm_judge: false,
            judge_min_similarity: 0.6,
            judge_candidates: 3,
        };
        (cfg.build(store, &dir).unwrap(), tmp)
    }

    fn chunk(id: &str, text: &str, entities: &[&str], at: i64) -> Chunk {
        let mut c = Chunk::new(id.into(), "s".into(), text.into(), at);
        c.subject = Some("user".into());
        c.entities = entities.iter().map(|e| e.to_string()).collect();
        c
    }

    #[tokio::test]
    async fn cues_name_what_is_replaced() {
        let (s, _t) = stage().await;
        let u = s
            .update_of(&chunk(
                "n",
                "I switched from VSCode to Cursor last week",
                &["cursor", "vscode"],
                2,
            ))
            .unwrap();
        assert!(u.keys.contains("vscode"), "{u:?}");
        assert!(!u.keys.contains("cursor"), "{u:?}");
        let u = s
            .update_of(&chunk(
                "n",
                "I now use Cursor for everything",
                &["cursor"],
                2,
            ))
            .unwrap();
        assert!(u.keys.contains("vscode") && u.keys.contains("vim"), "{u:?}");
        let u = s
            .update_of(&chunk("n", "My favorite color is green", &[], 2))
            .unwrap();
        assert_eq!(u.slot.as_deref(), Some("favorite color"));
        assert!(s
            .update_of(&chunk("n", "I use Cursor and like it", &["cursor"], 2))
            .is_none());
    }

    #[tokio::test]
    async fn an_update_in_the_same_batch_supersedes_the_earlier_memory() {
        let (s, _t) = stage().await;
        let mut batch = vec![
            Record::new(chunk("old", "I use VS Code for work", &["vscode"], 1)),
            Record::new(chunk("new", "I switched to Cursor", &["cursor"], 2)),
        ];
        s.process(&mut batch).await.unwrap();
        let (old, new) = (&batch[0].chunk, &batch[1].chunk);
        assert_eq!(old.superseded_by.as_deref(), Some("new"));
        assert_eq!(old.valid_until, Some(2));
        assert_eq!(new.supersedes.as_deref(), Some("old"));
        assert_eq!(new.version, 2);
        assert_eq!(batch[1].history.len(), 2);
        assert!(
            batch[1].history[0].reason.contains("switched to"),
            "{:?}",
            batch[1].history
        );
    }

    #[tokio::test]
    async fn an_update_in_a_batch_replaces_only_its_own_subject_and_stream() {
        let (s, _t) = stage().await;
        let about = |id: &str, stream: &str, subject: &str, text: &str, entity: &str, at| {
            let mut c = chunk(id, text, &[entity], at);
            c.stream = stream.into();
            c.subject = Some(subject.into());
            Record::new(c)
        };
        let mut batch = vec![
            about("alice", "s", "Alice", "Alice uses VS Code", "vscode", 1),
            about("mine", "s", "User", "I use VS Code at work", "vscode", 2),
            about("other", "t", "user", "I use VS Code at home", "vscode", 3),
            about("bob", "s", "Bob", "Bob switched to Cursor", "cursor", 4),
            about("new", "s", "user", "I switched to Cursor", "cursor", 5),
        ];
        s.process(&mut batch).await.unwrap();
        let by = |i: usize| batch[i].chunk.superseded_by.as_deref();
        assert_eq!(
            by(1),
            Some("new"),
            "the user's own memory (subject case aside)"
        );
        assert_eq!(by(0), None, "Alice's memory is not the user's");
        assert_eq!(by(2), None, "another stream's memory is left alone");
        assert_eq!(by(3), None);
        assert_eq!(batch[4].chunk.supersedes.as_deref(), Some("mine"));
    }

    #[tokio::test]
    async fn older_or_immutable_memories_are_left_alone() {
        let (s, _t) = stage().await;
        let mut frozen = chunk("frozen", "I use VS Code", &["vscode"], 1);
        frozen.immutable = true;
        let mut batch = vec![
            Record::new(frozen),
            Record::new(chunk("later", "I use Vim", &["vim"], 5)),
            Record::new(chunk("new", "I switched to Cursor", &["cursor"], 3)),
        ];
        s.process(&mut batch).await.unwrap();
        assert!(batch[0].chunk.superseded_by.is_none());
        assert!(
            batch[1].chunk.superseded_by.is_none(),
            "a newer memory is not replaced by an older one"
        );
    }
}
