//! Typed predicates over the memory tables. Callers say what they want in the
//! domain's words (`Filter::new().stream(s).current().unexpired(now)`); the
//! Lance SQL is written here and nowhere else, with every value quoted.

use std::fmt;

use crate::core::model::Micros;
use crate::core::Caller;

/// A conjunction of conditions on a table's rows; empty = every row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    clauses: Vec<String>,
    /// The same conditions, typed, for the in-memory index (`Opaque` where
    /// it cannot judge them).
    conds: Vec<Cond>,
}

/// One condition of a [`Filter`] in a form the hot index evaluates itself.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::store) enum Cond {
    Streams(Vec<String>),
    Current,
    Unexpired(Micros),
    CreatedSince(Micros),
    CreatedBefore(Micros),
    CreatedUntil(Micros),
    ValidAt(Micros),
    MemoryType(String),
    /// Lower-cased.
    Subject(String),
    MinConfidence(f64),
    /// The memory's `entities` hold this key (needs the row).
    MentionsKey(String),
    /// The memory's lower-cased text contains this (lower-case) text (needs the row).
    ContentContains(String),
    /// Any of these conjunctions holds.
    Any(Vec<Vec<Cond>>),
    /// Anything else: only Lance can judge it.
    Opaque,
}

impl Cond {
    /// True when judging the condition takes the memory's row (its text or
    /// entities), not only the filter columns a search scan holds.
    pub(in crate::store) fn needs_row(&self) -> bool {
        match self {
            Cond::MentionsKey(_) | Cond::ContentContains(_) => true,
            Cond::Any(branches) => branches.iter().flatten().any(Cond::needs_row),
            _ => false,
        }
    }

    fn is_opaque(&self) -> bool {
        match self {
            Cond::Opaque => true,
            Cond::Any(branches) => branches.iter().flatten().any(Cond::is_opaque),
            _ => false,
        }
    }
}

/// Quote a value for a Lance SQL filter.
pub(in crate::store) fn sql_str(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// A timestamp literal for a Lance filter.
pub(in crate::store) fn ts_lit(m: Micros) -> String {
    format!("arrow_cast({m}, 'Timestamp(Microsecond, None)')")
}

/// `column IN ('a', 'b', …)`, each value quoted.
pub(in crate::store) fn column_in<S: AsRef<str>>(
    column: &str,
    values: impl IntoIterator<Item = S>,
) -> String {
    let list: Vec<String> = values.into_iter().map(|v| sql_str(v.as_ref())).collect();
    if list.is_empty() {
        // `IN ()` is not valid SQL; no value matches an empty list.
        return "false".into();
    }
    format!("{column} IN ({})", list.join(", "))
}

impl Filter {
    /// Every row.
    pub fn new() -> Filter {
        Filter::default()
    }

    /// A condition only Lance can judge.
    pub(in crate::store) fn and(self, clause: String) -> Filter {
        self.typed(clause, Cond::Opaque)
    }

    fn typed(mut self, clause: String, cond: Cond) -> Filter {
        self.clauses.push(clause);
        self.conds.push(cond);
        self
    }

    /// The streams the filter confines rows to (its stream conditions
    /// intersected), whatever else it says; None when it names none.
    pub(in crate::store) fn streams(&self) -> Option<Vec<String>> {
        let mut out: Option<Vec<String>> = None;
        for c in &self.conds {
            if let Cond::Streams(list) = c {
                out = Some(match out {
                    None => list.clone(),
                    Some(s) => s.into_iter().filter(|x| list.contains(x)).collect(),
                });
            }
        }
        out
    }

    /// The typed conditions a search scan can judge from the filter columns
    /// alone, or `None` when one of them is opaque or needs the row.
    pub(in crate::store) fn conds(&self) -> Option<&[Cond]> {
        self.row_conds()
            .filter(|conds| !conds.iter().any(Cond::needs_row))
    }

    /// The typed conditions, some perhaps needing the memory's row, or
    /// `None` when one of them is opaque.
    pub(in crate::store) fn row_conds(&self) -> Option<&[Cond]> {
        (!self.conds.iter().any(Cond::is_opaque)).then_some(self.conds.as_slice())
    }

    /// True when the filter keeps every row.
    pub fn is_all(&self) -> bool {
        self.clauses.is_empty()
    }

    /// The Lance SQL of the filter (`None`: every row). Only the store reads it.
    pub(in crate::store) fn sql(&self) -> Option<String> {
        (!self.clauses.is_empty()).then(|| self.clauses.join(" AND "))
    }

    /// Rows of one stream.
    pub fn stream(self, stream: &str) -> Filter {
        self.typed(
            format!("stream = {}", sql_str(stream)),
            Cond::Streams(vec![stream.to_string()]),
        )
    }

    /// Rows of any of `streams`.
    pub fn in_streams<S: AsRef<str>>(self, streams: &[S]) -> Filter {
        let list: Vec<String> = streams.iter().map(|s| s.as_ref().to_string()).collect();
        self.typed(column_in("stream", &list), Cond::Streams(list))
    }

    /// Rows of the streams `caller` may see (every row for an unscoped caller).
    pub fn visible_to(self, caller: &Caller) -> Filter {
        match &caller.streams {
            Some(streams) => self.in_streams(streams),
            None => self,
        }
    }

    /// One row by id.
    pub fn id(self, id: &str) -> Filter {
        self.and(format!("id = {}", sql_str(id)))
    }

    /// Rows with any of `ids`.
    pub fn ids<S: AsRef<str>>(self, ids: &[S]) -> Filter {
        self.and(column_in("id", ids.iter().map(AsRef::as_ref)))
    }

    /// Every row but `id`.
    pub fn not_id(self, id: &str) -> Filter {
        self.and(format!("id != {}", sql_str(id)))
    }

    /// The latest version of each memory (not superseded).
    /// The versions that `id` superseded.
    pub fn superseded_by(self, id: &str) -> Filter {
        self.and(format!("superseded_by = {}", sql_str(id)))
    }

    /// The versions that any of `ids` superseded.
    pub fn superseded_by_any<S: AsRef<str>>(self, ids: &[S]) -> Filter {
        self.and(column_in("superseded_by", ids.iter().map(AsRef::as_ref)))
    }

    pub fn current(self) -> Filter {
        self.typed("superseded_by IS NULL".into(), Cond::Current)
    }

    /// Rows not expired at `now`.
    pub fn unexpired(self, now: Micros) -> Filter {
        self.typed(
            format!("(expires_at IS NULL OR expires_at > {})", ts_lit(now)),
            Cond::Unexpired(now),
        )
    }

    /// Rows whose expiry has passed at `now`.
    pub fn expired(self, now: Micros) -> Filter {
        self.and(format!(
            "expires_at IS NOT NULL AND expires_at <= {}",
            ts_lit(now)
        ))
    }

    /// Memories of one consolidation level (0 raw, 1 consolidated).
    pub fn level(self, level: i32) -> Filter {
        self.and(format!("level = {level}"))
    }

    /// Memories that may be changed (not `immutable`).
    pub fn mutable(self) -> Filter {
        self.and("NOT immutable".into())
    }

    /// Only immutable rows.
    pub fn immutable(self) -> Filter {
        self.and("immutable".into())
    }

    /// Memories not pinned.
    pub fn unpinned(self) -> Filter {
        self.and("NOT pinned".into())
    }

    /// Recorded at or after `t`.
    pub fn created_since(self, t: Micros) -> Filter {
        self.typed(
            format!("created_at >= {}", ts_lit(t)),
            Cond::CreatedSince(t),
        )
    }

    /// Recorded strictly before `t`.
    pub fn created_before(self, t: Micros) -> Filter {
        self.typed(
            format!("created_at < {}", ts_lit(t)),
            Cond::CreatedBefore(t),
        )
    }

    /// Recorded at or before `t`.
    pub fn created_until(self, t: Micros) -> Filter {
        self.typed(
            format!("created_at <= {}", ts_lit(t)),
            Cond::CreatedUntil(t),
        )
    }

    /// Facts that hold in the world at `t` (open validity bounds hold always).
    pub fn valid_at(self, t: Micros) -> Filter {
        let lit = ts_lit(t);
        self.typed(format!(
            "(valid_from IS NULL OR valid_from <= {lit}) AND (valid_until IS NULL OR valid_until > {lit})"
        ), Cond::ValidAt(t))
    }

    /// Memories that mention `entity` (lower-cased entity names).
    pub fn mentions(self, entity: &str) -> Filter {
        self.mentions_key(&entity.to_lowercase())
    }

    /// Memories whose text contains `text` (case-insensitive; `text` lower-case).
    pub fn content_contains(self, text: &str) -> Filter {
        let clause = format!("lower(content) LIKE {}", sql_str(&format!("%{text}%")));
        // LIKE's wildcards are not the plain substring the index looks for.
        if text.contains(['%', '_', '\\']) {
            self.and(clause)
        } else {
            self.typed(clause, Cond::ContentContains(text.to_string()))
        }
    }

    /// Memories that mention the entity key `key` exactly as stored.
    pub fn mentions_key(self, key: &str) -> Filter {
        self.typed(
            format!("array_has(entities, {})", sql_str(key)),
            Cond::MentionsKey(key.to_string()),
        )
    }

    /// Memories of one type (`fact`, `preference`, …).
    pub fn memory_type(self, memory_type: &str) -> Filter {
        self.typed(
            format!("memory_type = {}", sql_str(memory_type)),
            Cond::MemoryType(memory_type.to_string()),
        )
    }

    /// Memories about `subject`, compared case-insensitively.
    pub fn subject(self, subject: &str) -> Filter {
        let lower = subject.to_lowercase();
        self.typed(
            format!("lower(subject) = {}", sql_str(&lower)),
            Cond::Subject(lower),
        )
    }

    /// Memories with a confidence of at least `min`.
    pub fn min_confidence(self, min: f64) -> Filter {
        self.typed(format!("confidence >= {min}"), Cond::MinConfidence(min))
    }

    /// Memories of any of these types.
    pub fn memory_types<S: AsRef<str>>(self, types: &[S]) -> Filter {
        self.and(column_in("memory_type", types.iter().map(AsRef::as_ref)))
    }

    /// Memories carrying the tag `tag`.
    pub fn tagged(self, tag: &str) -> Filter {
        self.and(format!("array_has(tags, {})", sql_str(tag)))
    }

    /// Memories carrying any of `tags`.
    pub fn tagged_any<S: AsRef<str>>(self, tags: &[S]) -> Filter {
        let any: Vec<String> = tags
            .iter()
            .map(|t| format!("array_has(tags, {})", sql_str(t.as_ref())))
            .collect();
        if any.is_empty() {
            return self;
        }
        self.and(format!("({})", any.join(" OR ")))
    }

    /// Pinned memories, or (false) the others.
    pub fn pinned(self, pinned: bool) -> Filter {
        self.and(format!("pinned = {pinned}"))
    }

    /// Memories written for one agent.
    pub fn agent(self, agent_id: &str) -> Filter {
        self.and(format!("agent_id = {}", sql_str(agent_id)))
    }

    /// Memories of one end user.
    pub fn user(self, user_id: &str) -> Filter {
        self.and(format!("user_id = {}", sql_str(user_id)))
    }

    /// Memories of one conversation session.
    pub fn session(self, session_id: &str) -> Filter {
        self.and(format!("session_id = {}", sql_str(session_id)))
    }

    /// Memories whose normalised text hashes to any of `hashes`.
    pub fn content_hash_in<S: AsRef<str>>(self, hashes: &[S]) -> Filter {
        self.and(column_in("content_hash", hashes.iter().map(AsRef::as_ref)))
    }

    /// Memories with a vector of `model`.
    pub fn embedded_by(self, model: &str) -> Filter {
        self.and(format!(
            "embedding IS NOT NULL AND embed_model = {}",
            sql_str(model)
        ))
    }

    /// Memories without a vector of `model` (none, or another model's).
    pub fn stale_for(self, model: &str) -> Filter {
        self.and(format!(
            "(embedding IS NULL OR embed_model IS NULL OR embed_model != {})",
            sql_str(model)
        ))
    }

    /// Memories a pipeline annotated under `key` in `extraction_meta`.
    pub fn annotated(self, key: &str) -> Filter {
        self.and(format!(
            "extraction_meta LIKE {}",
            sql_str(&format!("%\"{key}\"%"))
        ))
    }

    /// Memories without an annotation under `key`.
    pub fn not_annotated(self, key: &str) -> Filter {
        self.and(format!(
            "(extraction_meta IS NULL OR extraction_meta NOT LIKE {})",
            sql_str(&format!("%\"{key}\"%"))
        ))
    }

    /// Rows of `job_runs` for one job.
    pub fn job(self, job: &str) -> Filter {
        self.and(format!("job = {}", sql_str(job)))
    }

    /// The SQL for a Lance `only_if` (`true` for every row).
    pub(in crate::store) fn predicate(&self) -> String {
        self.sql().unwrap_or_else(|| "true".into())
    }

    /// Rows matching `self` or `other` (an empty side keeps every row).
    pub fn or(self, other: Filter) -> Filter {
        let (Some(a), Some(b)) = (self.sql(), other.sql()) else {
            return Filter::new();
        };
        let clause = format!("(({a}) OR ({b}))");
        // A stream condition inside a branch is not one the index applies
        // per stream, so such an `or` stays Lance's.
        let typed = |f: &Filter| {
            f.row_conds()
                .filter(|c| !c.iter().any(|c| matches!(c, Cond::Streams(_))))
                .map(<[Cond]>::to_vec)
        };
        match (typed(&self), typed(&other)) {
            (Some(x), Some(y)) => {
                let mut branches = Vec::new();
                for side in [x, y] {
                    // An `or` of `or`s is one `Any`.
                    match side.as_slice() {
                        [Cond::Any(inner)] => branches.extend(inner.iter().cloned()),
                        _ => branches.push(side),
                    }
                }
                Filter::new().typed(clause, Cond::Any(branches))
            }
            _ => Filter::new().and(clause),
        }
    }

    /// Both filters at once.
    pub fn with(mut self, other: Filter) -> Filter {
        self.clauses.extend(other.clauses);
        self.conds.extend(other.conds);
        self
    }
}

/// The filter as the search trace shows it.
impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.sql().as_deref().unwrap_or("true"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clauses_join_and_values_are_quoted() {
        let f = Filter::new().stream("o'brien").current().level(0);
        assert_eq!(
            f.sql().unwrap(),
            "stream = 'o''brien' AND superseded_by IS NULL AND level = 0"
        );
        assert_eq!(Filter::new().sql(), None);
        assert_eq!(Filter::new().to_string(), "true");
    }

    #[test]
    fn an_empty_list_matches_nothing_and_scoping_follows_the_caller() {
        assert_eq!(Filter::new().ids::<String>(&[]).sql().unwrap(), "false");
        let scoped = Caller::scoped("a", vec!["s1".into(), "s2".into()]);
        assert_eq!(
            Filter::new().visible_to(&scoped).sql().unwrap(),
            "stream IN ('s1', 's2')"
        );
        assert!(Filter::new().visible_to(&Caller::admin("x")).is_all());
    }

    #[test]
    fn or_keeps_both_sides_together() {
        let f = Filter::new().stream("s").with(
            Filter::new()
                .session("a")
                .or(Filter::new().created_since(5)),
        );
        assert_eq!(
            f.sql().unwrap(),
            "stream = 's' AND ((session_id = 'a') OR (created_at >= arrow_cast(5, 'Timestamp(Microsecond, None)')))"
        );
    }
}
