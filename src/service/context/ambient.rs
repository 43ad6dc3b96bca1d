//! Ambient snippets for the start of a turn: the few memories worth showing
//! unasked, within a small budget.

use super::*;

#[derive(schemars::JsonSchema, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmbientRequest {
    /// What the agent is about to do (e.g. the user's message); without it the
    /// profile's strongest facts are used.
    pub query: Option<String>,
    pub stream: Option<String>,
    pub budget_tokens: Option<usize>,
    pub max_items: Option<usize>,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Snippet {
    pub chunk_id: String,
    pub text: String,
    pub memory_type: String,
    pub score: f32,
}

#[derive(schemars::JsonSchema, Debug, Serialize)]
pub struct Ambient {
    pub snippets: Vec<Snippet>,
    pub total_tokens: usize,
    pub budget_tokens: usize,
}

/// [`ambient`] on the read runtime (see [`crate::service::reads`]).
pub async fn ambient_on_reads(
    engine: &std::sync::Arc<Services>,
    caller: Caller,
    req: AmbientRequest,
) -> Result<Ambient> {
    crate::service::reads::read(
        engine,
        move |s| async move { ambient(&s, &caller, req).await },
    )
    .await
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
