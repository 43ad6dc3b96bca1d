//! The bench-recall run: for each question, a fresh stream; its haystack goes
//! through the real `import` pipeline (session id, turn index and the session
//! date as the memory's time); the question is searched as of its date in each
//! mode; the ranking maps back to turns and sessions and is scored.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;

use super::metrics::{evaluate, sessions_of, Scores, Summary, KS};
use super::Question;
use crate::app::Engine;
use crate::bus::Outcome;
use crate::core::error::{Error, Result};
use crate::core::Caller;
use crate::service::search::SearchRequest;

/// Which turns are indexed: the user's (as in the official setup) or all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Roles {
    User,
    All,
}

/// Which levels a report shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    Session,
    Turn,
    Both,
}

/// What else stands for a turn beside its own text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Keys {
    /// The turn alone (the official setup).
    None,
    /// Also the facts the rule extractor finds in a user turn (what
    /// `POST /v1/ingest` would store from it), each a memory of its own that
    /// counts for its turn: fact-augmented keys.
    Facts,
}

/// How a search's results become a ranking of sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionRank {
    /// As the search's `group_sessions` ranks them: each session its best
    /// result plus `search.session_rest_weight` times the others', over the
    /// first `search.session_pool` results.
    Grouped,
    /// Each session where the first turn found of it ranks.
    Turns,
}

impl Granularity {
    pub fn levels(self) -> &'static [&'static str] {
        match self {
            Granularity::Session => &["session"],
            Granularity::Turn => &["turn"],
            Granularity::Both => &["session", "turn"],
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Search modes to compare (`bm25`, `vector`, `hybrid`).
    pub modes: Vec<String>,
    pub roles: Roles,
    pub keys: Keys,
    /// The cut-offs scored (the official ones by default).
    pub ks: Vec<usize>,
    pub granularity: Granularity,
    pub session_rank: SessionRank,
    /// Also answer each question with the LLM from the memories the `hybrid`
    /// search (else the first mode) retrieved, and judge the answer.
    pub qa: bool,
    /// Also keep, per question, the first [`CANDIDATES`] hybrid candidates
    /// with every leg's rank and score (`RunReport::candidates`), for studying
    /// fusion offline.
    pub candidates: bool,
}

/// Candidates kept per question with `RunOptions::candidates`.
pub const CANDIDATES: usize = 300;

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            modes: vec!["bm25".into(), "vector".into(), "hybrid".into()],
            roles: Roles::User,
            keys: Keys::None,
            ks: KS.to_vec(),
            granularity: Granularity::Both,
            session_rank: SessionRank::Grouped,
            qa: false,
            candidates: false,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct QuestionResult {
    pub question_id: String,
    pub question_type: String,
    pub abstention: bool,
    pub mode: String,
    pub latency_us: u64,
    /// Scores per k; empty for abstention questions.
    pub session: BTreeMap<usize, Scores>,
    pub turn: BTreeMap<usize, Scores>,
    /// The first sessions retrieved, best first.
    pub top_sessions: Vec<String>,
    /// The first result's final score (none when nothing was found).
    pub top_score: Option<f32>,
    /// The QA mode's answer and verdict (for the mode it ran on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qa: Option<super::qa::QaResult>,
}

/// QA answers judged correct, of those judged.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct QaTally {
    pub correct: usize,
    pub judged: usize,
}

impl QaTally {
    pub fn accuracy(&self) -> f64 {
        if self.judged == 0 {
            0.0
        } else {
            self.correct as f64 / self.judged as f64
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ModeSummary {
    pub session: Summary,
    pub turn: Summary,
    pub by_type: BTreeMap<String, (Summary, Summary)>,
    pub latency_us_p50: u64,
    pub latency_us_p95: u64,
    pub latency_us_p99: u64,
    /// How well the first result's score tells an abstention question (no
    /// evidence in the haystack) from an answerable one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abstention: Option<Abstention>,
}

/// "I don't know" from the score alone: a caller that answers only when the
/// first result scores at least `threshold` (the threshold that best
/// separates the two kinds of question in this run, by balanced accuracy).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Abstention {
    pub threshold: f32,
    /// Abstention questions.
    pub unanswerable: usize,
    /// Of them, the share whose first result scores below the threshold.
    pub abstained: f64,
    /// Answerable questions.
    pub answerable: usize,
    /// Of them, the share wrongly below the threshold.
    pub wrongly_abstained: f64,
    /// The mean of the right abstentions and the right answers: 0.5 is no
    /// better than chance, 1.0 a perfect separation.
    pub balanced_accuracy: f64,
}

/// The threshold on the first result's score that best separates
/// abstention questions (`true`) from answerable ones; None without both.
pub fn abstention(tops: &[(bool, f32)]) -> Option<Abstention> {
    let unanswerable = tops.iter().filter(|(abs, _)| *abs).count();
    let answerable = tops.len() - unanswerable;
    if unanswerable == 0 || answerable == 0 {
        return None;
    }
    let mut cuts: Vec<f32> = tops.iter().map(|(_, s)| *s).collect();
    cuts.sort_by(f32::total_cmp);
    cuts.dedup();
    // At the lowest score (nobody abstains), between each pair of
    // neighbouring scores, and past the highest (everybody does).
    let mut candidates: Vec<f32> = vec![cuts[0]];
    candidates.extend(cuts.windows(2).map(|w| (w[0] + w[1]) / 2.0));
    candidates.push(cuts.last().copied().unwrap_or(0.0) + f32::EPSILON);
    let rate = |t: f32, abs: bool| {
        let n = tops.iter().filter(|(a, s)| *a == abs && *s < t).count();
        n as f64 / if abs { unanswerable } else { answerable } as f64
    };
    // Of equally good thresholds, the lowest (the fewest abstentions).
    candidates
        .into_iter()
        .rev()
        .map(|t| {
            let (abstained, wrongly_abstained) = (rate(t, true), rate(t, false));
            Abstention {
                threshold: t,
                unanswerable,
                abstained,
                answerable,
                wrongly_abstained,
                balanced_accuracy: (abstained + 1.0 - wrongly_abstained) / 2.0,
            }
        })
        .max_by(|a, b| a.balanced_accuracy.total_cmp(&b.balanced_accuracy))
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    /// The cut-offs scored.
    pub ks: Vec<usize>,
    /// The levels shown: `session`, `turn`.
    pub levels: Vec<&'static str>,
    pub questions: usize,
    pub turns_ingested: usize,
    /// Keys sent beside the turns (`Keys::Facts`; a key equal to a memory
    /// already stored is kept once).
    pub keys_sent: usize,
    pub ingest_secs: f64,
    pub ingest_turns_per_sec: f64,
    pub modes: BTreeMap<String, ModeSummary>,
    /// QA accuracy by question type (abstention counted as `abstention`), and
    /// `overall`; empty without `--qa`.
    pub qa: BTreeMap<String, QaTally>,
    /// QA calls that failed (not judged).
    pub qa_errors: usize,
    pub results: Vec<QuestionResult>,
    /// With `RunOptions::candidates`: one JSON object a question.
    #[serde(skip)]
    pub candidates: Vec<serde_json::Value>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The facts the rule extractor finds in a user turn, as of its session's
/// date, each as `request` (the turn's own: same session, time and speaker)
/// with the fact for its text.
fn fact_keys(
    engine: &Engine,
    turn: &crate::service::import::Turn,
    request: &crate::service::memory::StoreRequest,
) -> Vec<crate::service::memory::StoreRequest> {
    let date = turn
        .date
        .as_deref()
        .and_then(crate::service::import::parse_longmemeval_date)
        .and_then(chrono::DateTime::from_timestamp_micros)
        .map(|at| at.date_naive())
        .unwrap_or_default();
    let spoken = crate::service::facts::Turn {
        role: crate::service::facts::Role::User,
        content: turn.content.clone(),
    };
    engine
        .facts
        .extract(&[spoken], date)
        .into_iter()
        .map(|fact| crate::service::memory::StoreRequest {
            content: format!("{}: {}", turn.role, fact.content),
            ..request.clone()
        })
        .collect()
}

/// What one question's haystack left in its stream.
struct Stored {
    /// Each stored memory's turn ids (a duplicate turn counts for the memory
    /// that was kept; a key, for its turn).
    sources: HashMap<String, Vec<String>>,
    /// Keys sent beside the turns.
    keys: usize,
}

/// Store one question's haystack in `stream`.
async fn ingest(
    engine: &Engine,
    caller: &Caller,
    q: &Question,
    stream: &str,
    opts: &RunOptions,
) -> Result<Stored> {
    let mut keys_sent = 0;
    let mut chunks = Vec::new();
    let mut turn_of = HashMap::new();
    for t in &q.turns {
        if opts.roles == Roles::User && t.role != "user" {
            continue;
        }
        let mut req = t.to_request();
        req.stream = Some(stream.to_string());
        let keys = match opts.keys {
            Keys::Facts if t.role == "user" => fact_keys(engine, t, &req),
            _ => Vec::new(),
        };
        keys_sent += keys.len();
        let index = t.turn_index.to_string();
        let turn = std::iter::once(req).chain(keys);
        for (n, mut req) in turn.enumerate() {
            let key = n.to_string();
            let mut parts = vec![stream, &t.session_id, &index];
            if n > 0 {
                parts.push(&key);
            }
            req.id = Some(engine.ids.derive(&parts));
            let chunk = crate::service::memory::chunk_from_request(caller, req)?;
            turn_of.insert(chunk.id.clone(), Question::turn_id(t));
            chunks.push(chunk);
        }
    }
    let mut sources: HashMap<String, Vec<String>> = HashMap::new();
    for batch in chunks.chunks(engine.cfg.bus.batch_size.max(1)) {
        let ids: Vec<String> = batch.iter().map(|c| c.id.clone()).collect();
        let outcomes = crate::service::memory::publish_and_wait(
            engine,
            crate::pipeline::worker::envelopes("import", batch.to_vec(), true),
        )
        .await?;
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            let turn = turn_of[&id].clone();
            let kept = match outcome {
                Outcome::Stored { .. } => id,
                Outcome::Duplicate { existing_id } => existing_id,
                Outcome::Dropped { .. } => continue,
                Outcome::Failed { error } => {
                    return Err(Error::Internal(format!("turn {turn} not stored: {error}")))
                }
            };
            sources.entry(kept).or_default().push(turn);
        }
    }
    Ok(Stored {
        sources,
        keys: keys_sent,
    })
}

/// The turns stored for a question, each once (a turn and its keys are
/// several memories).
fn corpus_of(sources: &HashMap<String, Vec<String>>) -> Vec<String> {
    let turns: std::collections::BTreeSet<&String> = sources.values().flatten().collect();
    turns.into_iter().cloned().collect()
}

/// A question's first [`CANDIDATES`] hybrid candidates: for each, the turns it
/// stands for, its session, role and time, every leg's rank and raw score, and
/// the ranking factors. `corpus_turns`: how many turns the haystack stored.
async fn candidates(
    engine: &Engine,
    caller: &Caller,
    q: &Question,
    stream: &str,
    sources: &HashMap<String, Vec<String>>,
    corpus_turns: usize,
) -> Result<serde_json::Value> {
    let found = crate::service::search::search(
        engine,
        caller,
        SearchRequest {
            query: q.question.clone(),
            top_k: Some(CANDIDATES),
            stream: Some(stream.to_string()),
            now: Some(serde_json::json!(q.question_date as f64 / 1e6)),
            trace: true,
            dry_run: true,
            ..Default::default()
        },
    )
    .await?;
    let role: HashMap<String, &str> = q
        .turns
        .iter()
        .map(|t| (Question::turn_id(t), t.role.as_str()))
        .collect();
    let rows: Vec<serde_json::Value> = found
        .results
        .iter()
        .map(|r| {
            let turns = sources.get(&r.chunk_id).cloned().unwrap_or_default();
            let t = r.trace_info.as_ref();
            serde_json::json!({
                "turns": turns,
                "role": turns.first().and_then(|x| role.get(x)),
                "created_at": t.map(|t| t.created_at),
                "legs": t.map(|t| &t.legs),
                "factors": t.map(|t| t.factors),
                "score": r.score_final,
                "content": r.content,
            })
        })
        .collect();
    Ok(serde_json::json!({
        "question_id": q.id,
        "question_type": q.question_type,
        "question": q.question,
        "question_date": q.question_date / 1_000_000,
        "abstention": q.abstention,
        "answer_sessions": q.answer_sessions,
        "answer_turns": q.answer_turns(),
        "sessions": q.sessions(),
        "corpus_turns": corpus_turns,
        "candidates": rows,
    }))
}

/// Run every question in every mode.
pub async fn run(
    engine: &Engine,
    questions: &[Question],
    opts: &RunOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<RunReport> {
    let caller = Caller::admin("bench-recall");
    let qa_llm = match (opts.qa, &engine.llm) {
        (false, _) => None,
        (true, Some(llm)) => Some(llm.clone()),
        (true, None) => {
            return Err(Error::invalid(
                "qa",
                "the QA mode needs an [llm] endpoint in the configuration",
            ))
        }
    };
    let qa_mode = opts
        .modes
        .iter()
        .find(|m| *m == "hybrid")
        .or(opts.modes.first())
        .cloned();
    let mut ks = opts.ks.clone();
    ks.sort_unstable();
    ks.dedup();
    // Sessions are grouped over `search.session_pool` results, as
    // `group_sessions` groups them: a search that deep has the legs and the
    // first results of a `group_sessions` search of the deepest cut-off.
    let top_k = match opts.session_rank {
        SessionRank::Grouped => engine.cfg.search.session_pool,
        SessionRank::Turns => 0,
    }
    .max(ks.last().copied().unwrap_or(10))
    .max(1);
    let mut report = RunReport {
        ks: ks.clone(),
        levels: opts.granularity.levels().to_vec(),
        ..Default::default()
    };
    let mut latencies: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut ingest_time = 0.0;
    for (n, q) in questions.iter().enumerate() {
        let stream = format!(
            "bench-{}",
            q.id.chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                })
                .collect::<String>()
        );
        // The scratch store is thrown away: drop superseded table versions
        // now and then so a long run does not fill the disk (merges and
        // index refreshes leave a version behind each time).
        if n > 0 && n % 25 == 0 {
            for table in engine.store.tables().values() {
                crate::store::maintain::prune_all_versions(table).await?;
            }
        }
        let started = Instant::now();
        let Stored { sources, keys } = ingest(engine, &caller, q, &stream, opts).await?;
        ingest_time += started.elapsed().as_secs_f64();
        let corpus_turns = corpus_of(&sources);
        report.turns_ingested += corpus_turns.len();
        report.keys_sent += keys;
        let corpus_sessions = q.sessions();
        let answer_turns = q.answer_turns();
        let session_of: HashMap<String, &str> = q
            .turns
            .iter()
            .map(|t| (Question::turn_id(t), t.session_id.as_str()))
            .collect();
        if opts.candidates {
            report
                .candidates
                .push(candidates(engine, &caller, q, &stream, &sources, corpus_turns.len()).await?);
        }
        // The stream's first search loads it into the hot index (see
        // `store::hot`); a word searched first takes that load out of the
        // latencies, which measure a search of a loaded stream.
        crate::service::search::search(
            engine,
            &caller,
            SearchRequest {
                query: "memory".into(),
                top_k: Some(1),
                stream: Some(stream.clone()),
                mode: Some("hybrid".into()),
                dry_run: true,
                ..Default::default()
            },
        )
        .await?;
        for mode in &opts.modes {
            let started = Instant::now();
            let found = crate::service::search::search(
                engine,
                &caller,
                SearchRequest {
                    query: q.question.clone(),
                    top_k: Some(top_k),
                    stream: Some(stream.clone()),
                    mode: Some(mode.clone()),
                    now: Some(serde_json::json!(q.question_date as f64 / 1e6)),
                    // Dates of the memories, for the QA mode's context.
                    trace: qa_llm.is_some() && qa_mode.as_ref() == Some(mode),
                    dry_run: true,
                    ..Default::default()
                },
            )
            .await?;
            let latency_us = started.elapsed().as_micros() as u64;
            latencies.entry(mode.clone()).or_default().push(latency_us);
            // A turn counts at the rank of the first memory that stands for it.
            let mut seen = std::collections::HashSet::new();
            let ranked_turns: Vec<String> = found
                .results
                .iter()
                .flat_map(|r| sources.get(&r.chunk_id).cloned().unwrap_or_default())
                .filter(|t| seen.insert(t.clone()))
                .collect();
            let ranked_sessions = match opts.session_rank {
                // Grouped as `group_sessions` groups them, a memory counting
                // for the session of each turn it stands for (a turn told in
                // two sessions is stored once).
                SessionRank::Grouped => {
                    let mut counted = Vec::new();
                    for r in &found.results {
                        let mut its: Vec<&str> = Vec::new();
                        for t in sources.get(&r.chunk_id).into_iter().flatten() {
                            let s = session_of.get(t).copied().unwrap_or_default();
                            if !its.contains(&s) {
                                its.push(s);
                            }
                        }
                        counted.extend(
                            its.into_iter()
                                .map(|s| (Some(s), r.chunk_id.as_str(), r.score_final)),
                        );
                    }
                    crate::service::search::sessions::rank(
                        counted,
                        engine.cfg.search.session_rest_weight,
                    )
                    .into_iter()
                    .map(|s| s.session_id)
                    .collect()
                }
                SessionRank::Turns => sessions_of(&ranked_turns, |t| {
                    session_of.get(t).map(|s| s.to_string()).unwrap_or_default()
                }),
            };
            let mut result = QuestionResult {
                question_id: q.id.clone(),
                question_type: q.question_type.clone(),
                abstention: q.abstention,
                mode: mode.clone(),
                latency_us,
                session: BTreeMap::new(),
                turn: BTreeMap::new(),
                top_sessions: ranked_sessions.iter().take(10).cloned().collect(),
                top_score: found.results.first().map(|r| r.score_final),
                qa: None,
            };
            if let (Some(llm), true) = (&qa_llm, qa_mode.as_ref() == Some(mode)) {
                let memories: Vec<(String, String)> = found
                    .results
                    .iter()
                    .map(|r| {
                        let at = r.trace_info.as_ref().map_or(0, |t| t.created_at);
                        (
                            r.content.clone(),
                            crate::core::time::to_rfc3339(at * 1_000_000),
                        )
                    })
                    .collect();
                let kind = if q.abstention {
                    "abstention"
                } else {
                    q.question_type.as_str()
                };
                match super::qa::answer_and_judge(llm, &stream, q, &memories).await {
                    Ok(qa) => {
                        for key in [kind, "overall"] {
                            let t = report.qa.entry(key.to_string()).or_default();
                            t.judged += 1;
                            t.correct += usize::from(qa.correct);
                        }
                        result.qa = Some(qa);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, question = %q.id, "QA mode: no verdict");
                        report.qa_errors += 1;
                    }
                }
            }
            if !q.abstention {
                for &k in &ks {
                    result.session.insert(
                        k,
                        evaluate(&ranked_sessions, &q.answer_sessions, &corpus_sessions, k),
                    );
                    result
                        .turn
                        .insert(k, evaluate(&ranked_turns, &answer_turns, &corpus_turns, k));
                }
                let summary = report.modes.entry(mode.clone()).or_default();
                summary.session.add(&result.session);
                summary.turn.add(&result.turn);
                let (s, t) = summary.by_type.entry(q.question_type.clone()).or_default();
                s.add(&result.session);
                t.add(&result.turn);
            }
            report.results.push(result);
        }
        engine
            .store
            .delete(&crate::store::Filter::new().stream(&stream))
            .await?;
        report.questions += 1;
        progress(n + 1, questions.len());
    }
    for (mode, mut l) in latencies {
        l.sort_unstable();
        let tops: Vec<(bool, f32)> = report
            .results
            .iter()
            .filter(|r| r.mode == mode)
            .map(|r| (r.abstention, r.top_score.unwrap_or(f32::NEG_INFINITY)))
            .collect();
        let s = report.modes.entry(mode).or_default();
        s.abstention = abstention(&tops);
        s.latency_us_p50 = percentile(&l, 0.50);
        s.latency_us_p95 = percentile(&l, 0.95);
        s.latency_us_p99 = percentile(&l, 0.99);
    }
    report.ingest_secs = ingest_time;
    report.ingest_turns_per_sec = if ingest_time > 0.0 {
        report.turns_ingested as f64 / ingest_time
    } else {
        0.0
    };
    Ok(report)
}

/// The report as markdown: per mode, session- and turn-level recall_any@k,
/// recall_all@k and ndcg_any@k, then recall_any@k per question type, ingest
/// throughput and search latency.
pub fn markdown(report: &RunReport) -> String {
    let mut md = String::new();
    let ks = |f: &dyn Fn(usize) -> String| {
        report
            .ks
            .iter()
            .map(|&k| f(k))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    md.push_str(&format!(
        "{} questions ({} scored turns ingested at {:.0} turns/s{})\n\n",
        report.questions,
        report.turns_ingested,
        report.ingest_turns_per_sec,
        match report.keys_sent {
            0 => String::new(),
            n => format!("; {n} fact keys beside them"),
        }
    ));
    md.push_str(&format!(
        "| mode | level | metric | {} | p50 / p95 search |\n|---|---|---|{}---|\n",
        ks(&|k| format!("@{k}")),
        "---|".repeat(report.ks.len())
    ));
    for (mode, s) in &report.modes {
        for (level, summary) in [("session", &s.session), ("turn", &s.turn)] {
            if !report.levels.contains(&level) {
                continue;
            }
            for (metric, get) in [
                (
                    "recall_any",
                    (|x: &Scores| x.recall_any) as fn(&Scores) -> f64,
                ),
                ("recall_all", |x: &Scores| x.recall_all),
                ("ndcg_any", |x: &Scores| x.ndcg_any),
            ] {
                md.push_str(&format!(
                    "| {mode} | {level} | {metric} | {} | {:.1} / {:.1} ms |\n",
                    ks(&|k| summary
                        .at
                        .get(&k)
                        .map_or("-".into(), |x| format!("{:.3}", get(x)))),
                    s.latency_us_p50 as f64 / 1e3,
                    s.latency_us_p95 as f64 / 1e3
                ));
            }
        }
    }
    let abstaining: Vec<_> = report
        .modes
        .iter()
        .filter_map(|(mode, s)| s.abstention.as_ref().map(|a| (mode, a)))
        .collect();
    if !abstaining.is_empty() {
        md.push_str("\nAbstention from the first result's score (answer only at or above the threshold)\n\n| mode | threshold | abstention questions below it | answerable questions below it | balanced accuracy |\n|---|---|---|---|---|\n");
        for (mode, a) in abstaining {
            md.push_str(&format!(
                "| {mode} | {:.4} | {:.3} of {} | {:.3} of {} | {:.3} |\n",
                a.threshold,
                a.abstained,
                a.unanswerable,
                a.wrongly_abstained,
                a.answerable,
                a.balanced_accuracy
            ));
        }
        md.push('\n');
    }
    if !report.qa.is_empty() {
        md.push_str(&format!(
            "QA accuracy (LLM answer from the top {} memories, LLM judge; {} without a verdict)\n\n| type | correct | judged | accuracy |\n|---|---|---|---|\n",
            super::qa::CONTEXT_MEMORIES,
            report.qa_errors
        ));
        for (t, tally) in &report.qa {
            md.push_str(&format!(
                "| {t} | {} | {} | {:.3} |\n",
                tally.correct,
                tally.judged,
                tally.accuracy()
            ));
        }
        md.push('\n');
    }
    md.push_str(&format!(
        "\nsession recall_any@k by question type\n\n| mode | type | n | {} |\n|---|---|---|{}\n",
        ks(&|k| format!("@{k}")),
        "---|".repeat(report.ks.len())
    ));
    for (mode, s) in &report.modes {
        for (t, (session, _)) in &s.by_type {
            md.push_str(&format!(
                "| {mode} | {t} | {} | {} |\n",
                session.questions,
                ks(&|k| session
                    .at
                    .get(&k)
                    .map_or("-".into(), |x| format!("{:.3}", x.recall_any)))
            ));
        }
    }
    md
}

#[cfg(test)]
mod abstention_tests {
    use super::abstention;

    #[test]
    fn the_threshold_separates_unanswerable_from_answerable_questions() {
        let tops = [
            (true, 0.1),
            (true, 0.2),
            (false, 0.3),
            (false, 0.5),
            (true, 0.4),
        ];
        let a = abstention(&tops).unwrap();
        assert!((a.threshold - 0.25).abs() < 1e-6, "{a:?}");
        assert!((a.abstained - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(a.wrongly_abstained, 0.0);
        assert_eq!((a.unanswerable, a.answerable), (3, 2));
        assert!((a.balanced_accuracy - 5.0 / 6.0).abs() < 1e-9);
        // No separation at all: the lowest threshold, at chance.
        let flat = abstention(&[(true, 0.5), (false, 0.5)]).unwrap();
        assert_eq!((flat.abstained, flat.wrongly_abstained), (0.0, 0.0));
        assert_eq!(flat.balanced_accuracy, 0.5);
        assert!(abstention(&[(false, 0.3)]).is_none());
    }
}
