//! What an agent loads before it works: the stream's profile (`GET
//! /v1/profile`, MCP `memory_profile`), a token-budgeted context pack (`POST
//! /v1/context-pack`, `memory_context`), ambient snippets for the start of a
//! turn (`POST /v1/ambient`) and a MEMORY.md proposal (`GET
//! /v1/generate-memory-md`). Every budget is counted with [`crate::tokens`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::core::error::{Error, Result};
use crate::core::model::{now_micros, Chunk, Micros};
use crate::core::time::{parse_instant, to_rfc3339, DAY_MICROS};
use crate::core::tokens;
use crate::core::Caller;
use crate::service::search::{self, rank::Factors, SearchRequest};
use crate::service::Services;
use crate::store::Filter;

/// Most stable facts and recent items a profile lists.
const MAX_STABLE: usize = 30;
const MAX_RECENT: usize = 15;
/// "Recent" is the last week.
const RECENT_DAYS: i64 = 7;
/// How long a profile is served from the cache (a write to the stream ends it sooner).
const PROFILE_TTL: Duration = Duration::from_secs(3600);
/// Most memories read to build a profile or a MEMORY.md.
const SCAN_LIMIT: usize = 50_000;
/// Memory types that describe a moment or a plan rather than a lasting truth.
const TRANSIENT_TYPES: &[&str] = &["event", "plan", "observation", "project"];

/// The latest, unexpired memories of a stream (no embeddings), at most `limit`.
async fn latest(
    engine: &Services,
    stream: &str,
    extra: Filter,
    limit: usize,
) -> Result<Vec<Chunk>> {
    let filter = Filter::new()
        .stream(stream)
        .current()
        .unexpired(now_micros())
        .with(extra);
    Ok(engine
        .store
        .read_hits(None, &filter, limit)
        .await?
        .into_iter()
        .map(|h| h.chunk)
        .collect())
}

/// The `limit` newest of the stream's latest, unexpired memories, newest first.
pub async fn newest(engine: &Services, stream: &str, limit: usize) -> Result<Vec<Chunk>> {
    let mut all = latest(engine, stream, Filter::new(), SCAN_LIMIT).await?;
    all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    all.truncate(limit);
    Ok(all)
}

/// How much a memory's standing (decay, importance, feedback, recall count)
/// and extraction confidence recommend it, independent of any query.
fn standing(engine: &Services, c: &Chunk, now: Micros) -> f32 {
    let f = Factors::of(
        &engine.cfg.search,
        c,
        engine.store.feedback.tally(&c.id),
        now,
    );
    f.product() * c.confidence.clamp(0.05, 1.0) * if c.pinned { 1.5 } else { 1.0 }
}

fn by_score_then_recency(a: &(f32, Chunk), b: &(f32, Chunk)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0)
        .then_with(|| b.1.created_at.cmp(&a.1.created_at))
        .then_with(|| a.1.id.cmp(&b.1.id))
}

// ---------------------------------------------------------------- profile

#[derive(Debug, Clone, Serialize)]
pub struct ProfileFact {
    pub chunk_id: String,
    pub content: String,
    pub memory_type: String,
    pub score: f32,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub stream: String,
    /// Lasting truths, best first (≤ 30).
    pub stable_facts: Vec<ProfileFact>,
    /// The last 7 days, newest first (≤ 15).
    pub recent_context: Vec<ProfileFact>,
    /// 2–3 sentences.
    pub summary: String,
    /// `extractive`, or `llm` when the configured LLM wrote the summary.
    pub summary_source: &'static str,
    pub memories_considered: usize,
    pub generated_at: String,
    /// True when served from the cache.
    pub cached: bool,
}

impl Profile {
    pub fn markdown(&self) -> String {
        let mut out = format!("# Profile\n\n{}\n", self.summary);
        for (title, facts) in [
            ("Stable facts", &self.stable_facts),
            ("Recent context", &self.recent_context),
        ] {
            if !facts.is_empty() {
                out.push_str(&format!("\n## {title}\n"));
                for f in facts {
                    out.push_str(&format!("- {}\n", f.content));
                }
            }
        }
        out
    }
}

struct CachedProfile {
    generation: (u64, u64),
    built: Instant,
    profile: Profile,
}

/// Profiles per stream, valid for an hour or until the stream changes.
#[derive(Default)]
pub struct ProfileCache(Mutex<HashMap<String, CachedProfile>>);

fn fact(c: &Chunk, score: f32) -> ProfileFact {
    ProfileFact {
        chunk_id: c.id.clone(),
        content: c.content.clone(),
        memory_type: c.memory_type.clone(),
        score,
        created_at: to_rfc3339(c.created_at),
    }
}

/// The stream's profile, from the cache when still valid.
pub async fn profile(engine: &Services, caller: &Caller, stream: Option<&str>) -> Result<Profile> {
    let stream = caller.resolve_stream(stream)?;
    let generation = engine.store.generation(&stream);
    if let Some(hit) = engine
        .profiles
        .0
        .lock()
        .expect("profile cache")
        .get(&stream)
        .filter(|c| c.generation == generation && c.built.elapsed() < PROFILE_TTL)
    {
        let mut p = hit.profile.clone();
        p.cached = true;
        return Ok(p);
    }
    let profile = build_profile(engine, &stream).await?;
    engine.profiles.0.lock().expect("profile cache").insert(
        stream,
        CachedProfile {
            generation,
            built: Instant::now(),
            profile: profile.clone(),
        },
    );
    Ok(profile)
}

async fn build_profile(engine: &Services, stream: &str) -> Result<Profile> {
    let now = now_micros();
    let all = latest(engine, stream, Filter::new(), SCAN_LIMIT).await?;
    let considered = all.len();
    let recent_since = now - RECENT_DAYS * DAY_MICROS;
    let mut recent: Vec<&Chunk> = all
        .iter()
        .filter(|c| c.created_at >= recent_since)
        .collect();
    recent.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    recent.truncate(MAX_RECENT);
    let mut stable: Vec<(f32, Chunk)> = all
        .iter()
        .filter(|c| !TRANSIENT_TYPES.contains(&c.memory_type.as_str()))
        .map(|c| (standing(engine, c, now), c.clone()))
        .collect();
    stable.sort_by(by_score_then_recency);
    stable.truncate(MAX_STABLE);
    let stable_facts: Vec<ProfileFact> = stable.iter().map(|(s, c)| fact(c, *s)).collect();
    let recent_context: Vec<ProfileFact> = recent.iter().map(|c| fact(c, 0.0)).collect();
    let (summary, summary_source) =
        match llm_summary(engine, stream, &stable_facts, &recent_context).await {
            Some(s) => (s, "llm"),
            None => (
                extractive_summary(&all, &stable_facts, &recent_context),
                "extractive",
            ),
        };
    Ok(Profile {
        stream: stream.to_string(),
        stable_facts,
        recent_context,
        summary,
        summary_source,
        memories_considered: considered,
        generated_at: to_rfc3339(now),
        cached: false,
    })
}

/// Two or three sentences from the data itself: size and kinds of memory, the
/// most mentioned entities, the strongest fact, the latest event.
fn extractive_summary(all: &[Chunk], stable: &[ProfileFact], recent: &[ProfileFact]) -> String {
    if all.is_empty() {
        return "No memories in this stream yet.".into();
    }
    let mut types: BTreeMap<&str, usize> = BTreeMap::new();
    let mut entities: HashMap<&str, usize> = HashMap::new();
    for c in all {
        *types.entry(c.memory_type.as_str()).or_default() += 1;
        for e in &c.entities {
            *entities.entry(e.as_str()).or_default() += 1;
        }
    }
    let mut types: Vec<(&str, usize)> = types.into_iter().collect();
    types.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let kinds: Vec<String> = types
        .iter()
        .take(3)
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    let mut entities: Vec<(&str, usize)> = entities.into_iter().filter(|(_, n)| *n > 1).collect();
    entities.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut s = format!("{} memories ({}).", all.len(), kinds.join(", "));
    if !entities.is_empty() {
        let top: Vec<&str> = entities.iter().take(5).map(|(e, _)| *e).collect();
        s.push_str(&format!(" Most mentioned: {}.", top.join(", ")));
    }
    if let Some(f) = stable.first() {
        s.push_str(&format!(" Key fact: {}", sentence(&f.content)));
    } else if let Some(r) = recent.first() {
        s.push_str(&format!(" Latest: {}", sentence(&r.content)));
    }
    s
}

/// The first sentence of a text, ending in a full stop.
fn sentence(text: &str) -> String {
    let first = text
        .split_inclusive(['.', '!', '?', '\n'])
        .next()
        .unwrap_or(text)
        .trim();
    let first = tokens::truncate(first, 40).unwrap_or_default();
    if first.ends_with(['.', '!', '?', '…']) {
        first
    } else {
        format!("{first}.")
    }
}

const SUMMARY_PROMPT: &str = "You write a 2-3 sentence overview of a person from facts an assistant remembers about them. Use only the facts given; no speculation. Answer as JSON {\"summary\": \"...\"}.";

/// The LLM's summary when an LLM is configured and within budget; None otherwise
/// (the extractive summary takes over).
async fn llm_summary(
    engine: &Services,
    stream: &str,
    stable: &[ProfileFact],
    recent: &[ProfileFact],
) -> Option<String> {
    let llm = engine.llm.as_ref()?;
    if stable.is_empty() && recent.is_empty() {
        return None;
    }
    let mut prompt = String::from("Stable facts:\n");
    for f in stable {
        prompt.push_str(&format!("- {}\n", f.content));
    }
    prompt.push_str("Last 7 days:\n");
    for f in recent {
        prompt.push_str(&format!("- {}\n", f.content));
    }
    let reply = llm
        .chat_json(
            stream,
            "profile_summary",
            SUMMARY_PROMPT,
            &prompt,
            "profile_summary",
            serde_json::json!({
                "type": "object", "additionalProperties": false, "required": ["summary"],
                "properties": {"summary": {"type": "string"}},
            }),
        )
        .await
        .map_err(
            |e| tracing::warn!(error = %e, "profile summary by LLM failed; extractive instead"),
        )
        .ok()?;
    reply.json["summary"]
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

// ---------------------------------------------------------------- context pack

pub const SECTIONS: [&str; 3] = ["profile", "relevant", "recent"];
/// Share of the budget per section, in `SECTIONS` order.
const SHARES: [f64; 3] = [0.2, 0.5, 0.3];
const MAX_BUDGET: usize = 200_000;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextPackRequest {
    pub query: Option<String>,
    pub stream: Option<String>,
    pub budget_tokens: Option<usize>,
    pub sections: Option<Vec<String>>,
    /// The instant "recent" and decay count from (default now).
    pub now: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct Source {
    pub chunk_id: String,
    pub score: f32,
    pub section: &'static str,
}

#[derive(Debug, Serialize)]
pub struct ContextPack {
    pub context: String,
    pub sources: Vec<Source>,
    pub total_tokens: usize,
    pub budget_tokens: usize,
    pub sections_included: Vec<&'static str>,
    pub sections_truncated: Vec<&'static str>,
}

/// A rendered line, the memory it shows, its score.
type Line = (String, String, f32);

/// A section's candidate lines, best first.
struct Section {
    name: &'static str,
    title: &'static str,
    lines: Vec<Line>,
}

impl Section {
    fn header(&self) -> String {
        format!("## {}", self.title)
    }

    /// Tokens to show every line.
    fn needed(&self) -> usize {
        if self.lines.is_empty() {
            return 0;
        }
        tokens::count(&self.header())
            + self
                .lines
                .iter()
                .map(|(l, ..)| tokens::count(&format!("\n{l}")))
                .sum::<usize>()
    }
}

/// Split `budget` over the sections by their shares; what a section does not
/// need flows to the others, in the order relevant, recent, profile.
fn allocate(budget: usize, shares: &[f64], needed: &[usize]) -> Vec<usize> {
    let total_share: f64 = shares.iter().sum();
    let mut alloc: Vec<usize> = shares
        .iter()
        .map(|s| {
            if total_share > 0.0 {
                (budget as f64 * s / total_share).floor() as usize
            } else {
                0
            }
        })
        .collect();
    let mut spare: usize = budget - alloc.iter().sum::<usize>();
    for i in 0..alloc.len() {
        if alloc[i] > needed[i] {
            spare += alloc[i] - needed[i];
            alloc[i] = needed[i];
        }
    }
    for i in [1, 2, 0] {
        if i < alloc.len() && needed[i] > alloc[i] {
            let give = spare.min(needed[i] - alloc[i]);
            alloc[i] += give;
            spare -= give;
        }
    }
    alloc
}

pub async fn context_pack(
    engine: &Services,
    caller: &Caller,
    req: ContextPackRequest,
) -> Result<ContextPack> {
    let budget = req.budget_tokens.unwrap_or(4000);
    if budget == 0 || budget > MAX_BUDGET {
        return Err(Error::invalid(
            "budget_tokens",
            format!("must be between 1 and {MAX_BUDGET}"),
        ));
    }
    let wanted: Vec<&'static str> = match &req.sections {
        None => SECTIONS.to_vec(),
        Some(list) if list.is_empty() => {
            return Err(Error::invalid("sections", "must name at least one section"))
        }
        Some(list) => {
            let mut out = Vec::new();
            for s in list {
                let Some(known) = SECTIONS.iter().find(|k| **k == s.trim()) else {
                    return Err(Error::invalid(
                        "sections",
                        format!("`{s}`: must be profile, relevant or recent"),
                    ));
                };
                if !out.contains(known) {
                    out.push(*known);
                }
            }
            out
        }
    };
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let now = match &req.now {
        Some(v) => parse_instant("now", v)?,
        None => now_micros(),
    };
    let query = req
        .query
        .as_deref()
        .map(str::trim)
        .filter(|q| !q.is_empty());

    let mut relevant = Section {
        name: "relevant",
        title: "Relevant",
        lines: Vec::new(),
    };
    if let (true, Some(q)) = (wanted.contains(&"relevant"), query) {
        let found = search::recall(
            engine,
            caller,
            &SearchRequest {
                query: q.to_string(),
                top_k: Some(30),
                stream: Some(stream.clone()),
                now: req.now.clone(),
                ..Default::default()
            },
        )
        .await?;
        for r in found.results {
            relevant
                .lines
                .push((format!("- {}", r.chunk.content), r.chunk.id, r.score));
        }
    }
    let mut recent = Section {
        name: "recent",
        title: "Recent",
        lines: Vec::new(),
    };
    if wanted.contains(&"recent") {
        let since = now - RECENT_DAYS * DAY_MICROS;
        let mut items = latest(
            engine,
            &stream,
            Filter::new().created_since(since).created_until(now),
            SCAN_LIMIT,
        )
        .await?;
        items.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        for c in items {
            let day = to_rfc3339(c.created_at);
            let line = format!("- {}: {}", &day[..10.min(day.len())], c.content);
            recent.lines.push((line, c.id, 0.0));
        }
    }
    let mut profile_section = Section {
        name: "profile",
        title: "Profile",
        lines: Vec::new(),
    };
    if wanted.contains(&"profile") {
        let p = profile(engine, caller, Some(&stream)).await?;
        for f in p.stable_facts {
            profile_section
                .lines
                .push((format!("- {}", f.content), f.chunk_id, f.score));
        }
    }

    let sections = [profile_section, relevant, recent];
    let shares: Vec<f64> = sections
        .iter()
        .zip(SHARES)
        .map(|(s, share)| if wanted.contains(&s.name) { share } else { 0.0 })
        .collect();
    let needed: Vec<usize> = sections.iter().map(Section::needed).collect();
    // The blank lines between sections cost tokens too: reserve them.
    let separators = wanted.len().saturating_sub(1) * tokens::count("\n\n");
    let budget_lines = budget.saturating_sub(separators);
    let mut alloc = allocate(budget_lines, &shares, &needed);
    // Fill in order (profile, relevant, recent); a memory shown in an earlier
    // section is skipped later, which can leave budget unspent: hand it to the
    // sections that were cut (relevant first) and fill again.
    let mut filled = fill(&sections, &alloc);
    for _ in 0..3 {
        let spent: usize = filled.iter().map(|f| f.spent).sum();
        let mut spare = budget_lines.saturating_sub(spent);
        if spare == 0 || !filled.iter().any(|f| f.truncated) {
            break;
        }
        for i in 0..alloc.len() {
            if !filled[i].truncated {
                // Give back what this section did not use.
                let unused = alloc[i].saturating_sub(filled[i].spent);
                alloc[i] -= unused;
                spare += unused;
            }
        }
        if let Some(i) = [1, 2, 0].into_iter().find(|&i| filled[i].truncated) {
            alloc[i] += spare;
        }
        filled = fill(&sections, &alloc);
    }
    let mut truncated: Vec<&'static str> = Vec::new();
    let mut blocks: Vec<(&'static str, Vec<Line>)> = Vec::new();
    for (section, f) in sections.iter().zip(filled) {
        if f.truncated {
            truncated.push(section.name);
        }
        if !f.lines.is_empty() {
            blocks.push((section.name, f.lines));
        }
    }
    let render = |blocks: &[(&'static str, Vec<Line>)]| -> String {
        blocks
            .iter()
            .map(|(name, lines)| {
                let title = match *name {
                    "profile" => "Profile",
                    "relevant" => "Relevant",
                    _ => "Recent",
                };
                let mut s = format!("## {title}");
                for (l, ..) in lines {
                    s.push('\n');
                    s.push_str(l);
                }
                s
            })
            .collect::<Vec<_>>()
            .join("\n\n")
    };
    let mut context = render(&blocks);
    let mut total = tokens::count(&context);
    // Tokens are counted per line; merges across line ends could differ.
    // Drop trailing lines until the whole text fits.
    while total > budget {
        let Some(last) = blocks.last_mut() else { break };
        last.1.pop();
        let name = last.0;
        if !truncated.contains(&name) {
            truncated.push(name);
        }
        if last.1.is_empty() {
            blocks.pop();
        }
        context = render(&blocks);
        total = tokens::count(&context);
    }
    let sources = blocks
        .iter()
        .flat_map(|(name, lines)| {
            lines.iter().map(|(_, id, score)| Source {
                chunk_id: id.clone(),
                score: *score,
                section: name,
            })
        })
        .collect();
    Ok(ContextPack {
        context,
        sources,
        total_tokens: total,
        budget_tokens: budget,
        sections_included: blocks.iter().map(|(n, _)| *n).collect(),
        sections_truncated: truncated,
    })
}

struct Filled {
    lines: Vec<Line>,
    spent: usize,
    /// Some line of this section that no other section shows did not fit.
    truncated: bool,
}

/// Each section's lines within its allocation, in order; a memory already
/// shown by an earlier section is skipped.
fn fill(sections: &[Section], alloc: &[usize]) -> Vec<Filled> {
    let mut shown: HashSet<&str> = HashSet::new();
    let mut out = Vec::new();
    for (section, &limit) in sections.iter().zip(alloc) {
        let mut f = Filled {
            lines: Vec::new(),
            spent: 0,
            truncated: false,
        };
        let header = tokens::count(&section.header());
        for (line, id, score) in &section.lines {
            if shown.contains(id.as_str()) {
                continue;
            }
            let cost =
                tokens::count(&format!("\n{line}")) + if f.lines.is_empty() { header } else { 0 };
            if f.spent + cost <= limit {
                f.spent += cost;
                f.lines.push((line.clone(), id.clone(), *score));
                shown.insert(id);
            } else {
                f.truncated = true;
            }
        }
        out.push(f);
    }
    out
}

// ---------------------------------------------------------------- ambient

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmbientRequest {
    /// What the agent is about to do (e.g. the user's message); without it the
    /// profile's strongest facts are used.
    pub query: Option<String>,
    pub stream: Option<String>,
    pub budget_tokens: Option<usize>,
    pub max_items: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct Snippet {
    pub chunk_id: String,
    pub text: String,
    pub memory_type: String,
    pub score: f32,
}

#[derive(Debug, Serialize)]
pub struct Ambient {
    pub snippets: Vec<Snippet>,
    pub total_tokens: usize,
    pub budget_tokens: usize,
}

/// A few plain facts (one line each, no markup) within a small budget. Not
/// counted as accesses: an agent may call it every turn.
pub async fn ambient(engine: &Services, caller: &Caller, req: AmbientRequest) -> Result<Ambient> {
    let budget = req.budget_tokens.unwrap_or(250);
    if budget == 0 || budget > 8000 {
        return Err(Error::invalid(
            "budget_tokens",
            "must be between 1 and 8000",
        ));
    }
    let max_items = req.max_items.unwrap_or(8);
    if max_items == 0 || max_items > 50 {
        return Err(Error::invalid("max_items", "must be between 1 and 50"));
    }
    let stream = caller.resolve_stream(req.stream.as_deref())?;
    let candidates: Vec<(String, String, String, f32)> = match req
        .query
        .as_deref()
        .map(str::trim)
        .filter(|q| !q.is_empty())
    {
        Some(q) => search::recall(
            engine,
            caller,
            &SearchRequest {
                query: q.to_string(),
                top_k: Some(max_items * 2),
                stream: Some(stream),
                dry_run: true,
                ..Default::default()
            },
        )
        .await?
        .results
        .into_iter()
        .map(|r| (r.chunk.id, r.chunk.content, r.chunk.memory_type, r.score))
        .collect(),
        None => profile(engine, caller, Some(&stream))
            .await?
            .stable_facts
            .into_iter()
            .map(|f| (f.chunk_id, f.content, f.memory_type, f.score))
            .collect(),
    };
    // One line per snippet; long memories are cut to a fair share of the budget.
    let per_item = (budget / max_items).max(24);
    let mut snippets = Vec::new();
    let mut spent = 0;
    for (id, content, memory_type, score) in candidates {
        if snippets.len() == max_items {
            break;
        }
        let plain = content.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(text) = tokens::truncate(&plain, per_item.min(budget - spent)) else {
            continue;
        };
        let cost = tokens::count(&text) + usize::from(!snippets.is_empty());
        if spent + cost > budget {
            continue;
        }
        spent += cost;
        snippets.push(Snippet {
            chunk_id: id,
            text,
            memory_type,
            score,
        });
    }
    let joined: Vec<&str> = snippets.iter().map(|s| s.text.as_str()).collect();
    Ok(Ambient {
        total_tokens: tokens::count(&joined.join("\n")),
        snippets,
        budget_tokens: budget,
    })
}

// ---------------------------------------------------------------- MEMORY.md

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryMdQuery {
    pub stream: Option<String>,
    /// How many of the stream's best memories to consider (default 200).
    pub max_chunks: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct MemoryMdMeta {
    pub chunks_considered: usize,
    pub sections: usize,
    pub entries: usize,
}

#[derive(Debug, Serialize)]
pub struct MemoryMd {
    pub proposal: String,
    pub metadata: MemoryMdMeta,
}

/// Sections of the proposal and the memory types each gathers.
const MD_SECTIONS: &[(&str, &[&str])] = &[
    ("Identity", &["fact", "biography"]),
    ("Preferences", &["preference"]),
    ("Decisions", &["decision", "correction"]),
    ("Projects", &["project", "plan"]),
    ("Events", &["event"]),
    ("Notes", &[]),
];
/// Most entries per section.
const MD_PER_SECTION: usize = 15;

pub async fn memory_md(engine: &Services, caller: &Caller, q: MemoryMdQuery) -> Result<MemoryMd> {
    let max = q.max_chunks.unwrap_or(200);
    if max == 0 || max > 5000 {
        return Err(Error::invalid("max_chunks", "must be between 1 and 5000"));
    }
    let stream = caller.resolve_stream(q.stream.as_deref())?;
    let now = now_micros();
    let mut scored: Vec<(f32, Chunk)> = latest(engine, &stream, Filter::new(), SCAN_LIMIT)
        .await?
        .into_iter()
        .map(|c| (standing(engine, &c, now), c))
        .collect();
    scored.sort_by(by_score_then_recency);
    scored.truncate(max);
    let considered = scored.len();
    let mut grouped: Vec<Vec<String>> = vec![Vec::new(); MD_SECTIONS.len()];
    let mut seen = HashSet::new();
    for (_, c) in &scored {
        let line = c.content.split_whitespace().collect::<Vec<_>>().join(" ");
        if !seen.insert(line.to_lowercase()) {
            continue;
        }
        let i = MD_SECTIONS
            .iter()
            .position(|(_, types)| types.contains(&c.memory_type.as_str()))
            .unwrap_or(MD_SECTIONS.len() - 1);
        if grouped[i].len() < MD_PER_SECTION {
            grouped[i].push(line);
        }
    }
    let mut proposal = String::from("# Memory\n");
    let (mut sections, mut entries) = (0, 0);
    for ((title, _), lines) in MD_SECTIONS.iter().zip(&grouped) {
        if lines.is_empty() {
            continue;
        }
        sections += 1;
        entries += lines.len();
        proposal.push_str(&format!("\n## {title}\n"));
        for l in lines {
            proposal.push_str(&format!("- {l}\n"));
        }
    }
    Ok(MemoryMd {
        proposal,
        metadata: MemoryMdMeta {
            chunks_considered: considered,
            sections,
            entries,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_budget_flows_to_the_sections_that_need_it() {
        // Profile needs little; relevant needs a lot.
        let a = allocate(1000, &SHARES, &[50, 2000, 100]);
        assert_eq!(a, vec![50, 850, 100]);
        assert!(a.iter().sum::<usize>() <= 1000);
        // Everything needed more than its share: the shares stand.
        assert_eq!(
            allocate(1000, &SHARES, &[5000, 5000, 5000]),
            vec![200, 500, 300]
        );
        // A section not asked for has no share; its part flows on.
        let b = allocate(1000, &[0.0, 0.5, 0.0], &[0, 5000, 0]);
        assert_eq!(b, vec![0, 1000, 0]);
    }

    #[test]
    fn summary_sentence_is_short_and_closed() {
        assert_eq!(sentence("Uses Cursor. Also VSCode."), "Uses Cursor.");
        assert_eq!(sentence("Uses Cursor"), "Uses Cursor.");
    }
}
