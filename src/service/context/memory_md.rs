//! The MEMORY.md proposal: the best memories grouped by kind.

use super::*;

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryMdQuery {
    pub stream: Option<String>,
    /// How many of the stream's best memories to consider (default 200).
    pub max_chunks: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct MemoryMdMeta {
    pub chunks_considered: usize,
    pub sections: usize,
    pub entries: usize,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct MemoryMd {
    pub proposal: String,
    pub metadata: MemoryMdMeta,
}

/// Sections of the proposal and the memory types each gathers.
pub(super) const MD_SECTIONS: &[(&str, &[&str])] = &[
    ("Identity", &["fact", "biography"]),
    ("Preferences", &["preference"]),
    ("Decisions", &["decision", "correction"]),
    ("Projects", &["project", "plan"]),
    ("Events", &["event"]),
    ("Notes", &[]),
];
/// Most entries per section.
pub(super) const MD_PER_SECTION: usize = 15;

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
