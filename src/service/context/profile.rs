//! The stream's profile: lasting truths, the recent week and a short summary
//! (extractive, or written by the configured LLM), cached per stream.

use super::*;

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

pub(super) struct CachedProfile {
    generation: (u64, u64),
    built: Instant,
    profile: Profile,
}

/// Profiles per stream, valid for an hour or until the stream changes.
#[derive(Default)]
pub struct ProfileCache(Mutex<HashMap<String, CachedProfile>>);

pub(super) fn fact(c: &Chunk, score: f32) -> ProfileFact {
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

pub(super) async fn build_profile(engine: &Services, stream: &str) -> Result<Profile> {
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
pub(super) fn extractive_summary(
    all: &[Chunk],
    stable: &[ProfileFact],
    recent: &[ProfileFact],
) -> String {
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
pub(super) fn sentence(text: &str) -> String {
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

pub(super) const SUMMARY_PROMPT: &str = "You write a 2-3 sentence overview of a person from facts an assistant remembers about them. Use only the facts given; no speculation. Answer as JSON {\"summary\": \"...\"}.";

/// The LLM's summary when an LLM is configured and within budget; None otherwise
/// (the extractive summary takes over).
pub(super) async fn llm_summary(
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
