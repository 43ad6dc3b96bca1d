//! The token-budgeted context pack: profile, relevant and recent sections
//! sharing one budget, unused share flowing to the sections that need it.

use super::*;

pub const SECTIONS: [&str; 3] = ["profile", "relevant", "recent"];
/// Share of the budget per section, in `SECTIONS` order.
pub(super) const SHARES: [f64; 3] = [0.2, 0.5, 0.3];
pub(super) const MAX_BUDGET: usize = 200_000;

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextPackRequest {
    pub query: Option<String>,
    pub stream: Option<String>,
    pub budget_tokens: Option<usize>,
    pub sections: Option<Vec<String>>,
    /// The instant "recent" and decay count from (default now).
    pub now: Option<serde_json::Value>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Source {
    pub chunk_id: String,
    pub score: f32,
    pub section: &'static str,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct ContextPack {
    pub context: String,
    pub sources: Vec<Source>,
    pub total_tokens: usize,
    pub budget_tokens: usize,
    pub sections_included: Vec<&'static str>,
    pub sections_truncated: Vec<&'static str>,
}

/// A rendered line, the memory it shows, its score.
pub(super) type Line = (String, String, f32);

/// A section's candidate lines, best first.
pub(super) struct Section {
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
pub(super) fn allocate(budget: usize, shares: &[f64], needed: &[usize]) -> Vec<usize> {
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

/// [`context_pack`] on the read runtime (see [`crate::service::reads`]).
pub async fn context_pack_on_reads(
    engine: &std::sync::Arc<Services>,
    caller: Caller,
    req: ContextPackRequest,
) -> Result<ContextPack> {
    crate::service::reads::read(engine, move |s| async move {
        context_pack(&s, &caller, req).await
    })
    .await
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

pub(super) struct Filled {
    lines: Vec<Line>,
    spent: usize,
    /// Some line of this section that no other section shows did not fit.
    truncated: bool,
}

/// Each section's lines within its allocation, in order; a memory already
/// shown by an earlier section is skipped.
pub(super) fn fill(sections: &[Section], alloc: &[usize]) -> Vec<Filled> {
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
