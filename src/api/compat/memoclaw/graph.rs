//! MemoClaw's relations between memories, its graph walk and history.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::*;

// ---------------------------------------------------------------- graph

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NewRelation {
    target_id: String,
    relation_type: Option<String>,
    metadata: Option<Value>,
}

/// `POST /v1/memories/{id}/relations`: 201 with the relation.
pub(super) async fn relate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<NewRelation>,
) -> Result<(StatusCode, Json<Value>)> {
    let note = match req.metadata {
        None | Some(Value::Null) => None,
        Some(m @ Value::Object(_)) => Some(m.to_string()).filter(|s| s != "{}"),
        Some(_) => return Err(Error::invalid("metadata", "must be an object")),
    };
    let made = service::relations::create(
        &engine,
        &caller,
        service::relations::RelateRequest {
            from_id: id,
            to_id: req.target_id,
            relation: req.relation_type.unwrap_or_else(|| "related_to".into()),
            weight: None,
            note,
        },
    )
    .await
    .map_err(renamed_relation)?;
    Ok((StatusCode::CREATED, Json(relation(&made.relation))))
}

/// loomem's field names in a relation error as MemoClaw's.
fn renamed_relation(e: Error) -> Error {
    match e {
        Error::Invalid { field, message } => Error::invalid(
            match field.as_str() {
                "relation" => "relation_type",
                "to_id" => "target_id",
                other => other,
            },
            message,
        ),
        other => other,
    }
}

/// `GET /v1/memories/{id}/relations`.
pub(super) async fn relations(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    service::edit::get(&engine, &caller, &id).await?;
    Ok(Json(
        json!({"relations": links(&engine, &caller, &id).await?}),
    ))
}

/// `DELETE /v1/memories/{id}/relations/{relation_id}`: 404 unless the
/// relation touches the memory.
pub(super) async fn unrelate(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path((id, relation_id)): Path<(String, String)>,
) -> Result<Json<Value>> {
    let touching = links(&engine, &caller, &id).await?;
    if !touching.iter().any(|r| r["id"] == json!(relation_id)) {
        return Err(Error::NotFound(format!(
            "memory `{id}` has no relation `{relation_id}`"
        )));
    }
    service::relations::delete(&engine, &caller, &relation_id).await?;
    Ok(Json(json!({"deleted": true, "id": relation_id})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GraphParams {
    depth: Option<usize>,
    limit: Option<usize>,
    relation_types: Option<String>,
}

/// `GET /v1/memories/{id}/graph`: the memories reached from this one over
/// relations (of `relation_types`, if given) within `depth` hops, nearest
/// first, and the relations among them. loomem walks at most 4 hops.
pub(super) async fn graph(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<GraphParams>,
) -> Result<Json<Value>> {
    let depth = q.depth.unwrap_or(2);
    if !(1..=5).contains(&depth) {
        return Err(Error::invalid("depth", "must be between 1 and 5"));
    }
    let limit = super::super::limit_of("limit", q.limit, 50, 200)?;
    let types: Option<Vec<&str>> = q.relation_types.as_deref().map(|t| {
        t.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect()
    });
    let sub = service::relations::explore(
        &engine,
        &caller,
        &service::relations::ExploreQuery {
            from: id.clone(),
            stream: None,
            hops: Some(depth.min(4)),
            max_nodes: Some(500),
        },
    )
    .await?;
    let edges: Vec<&service::relations::Edge> = sub
        .edges
        .iter()
        .filter(|e| e.kind != "mentions")
        .filter(|e| types.as_ref().is_none_or(|t| t.contains(&e.kind.as_str())))
        .collect();
    let mut next: HashMap<&str, Vec<&str>> = HashMap::new();
    for e in &edges {
        next.entry(&e.from).or_default().push(&e.to);
        next.entry(&e.to).or_default().push(&e.from);
    }
    // Breadth first over the relations alone.
    let mut reached: Vec<(String, usize)> = vec![(id.clone(), 0)];
    let mut seen: HashSet<&str> = HashSet::from([id.as_str()]);
    let mut queue = VecDeque::from([(id.as_str(), 0)]);
    while let Some((node, d)) = queue.pop_front() {
        if d == depth {
            continue;
        }
        for n in next.get(node).into_iter().flatten() {
            if reached.len() < limit && seen.insert(n) {
                reached.push((n.to_string(), d + 1));
                queue.push_back((n, d + 1));
            }
        }
    }
    let mut nodes = Vec::with_capacity(reached.len());
    for (node, d) in &reached {
        let mut m = memory_by_id(&engine, &caller, node).await?;
        m["depth"] = json!(d);
        nodes.push(m);
    }
    let kept: HashSet<&str> = reached.iter().map(|(n, _)| n.as_str()).collect();
    let edges: Vec<Value> = edges
        .iter()
        .filter(|e| kept.contains(e.from.as_str()) && kept.contains(e.to.as_str()))
        .map(|e| json!({"source_id": e.from, "target_id": e.to, "relation_type": e.kind}))
        .collect();
    Ok(Json(
        json!({"memory_id": id, "nodes": nodes, "edges": edges}),
    ))
}

/// `GET /v1/memories/{id}/history`: every recorded change of the memory and
/// its earlier versions, oldest first.
pub(super) async fn history(
    State(engine): State<Arc<Engine>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>> {
    let h = service::memory::history(&engine, &caller, &id, None).await?;
    let text: HashMap<&str, &str> = h
        .versions
        .iter()
        .map(|v| (v.chunk_id.as_str(), v.content.as_str()))
        .collect();
    let rows: Vec<Value> = h
        .events
        .iter()
        .map(|e| {
            let mut changes = json!({"event": e.event, "reason": e.reason});
            if e.event == "edited" {
                changes["content"] = json!(text.get(e.chunk_id.as_str()));
            }
            json!({
                "id": e.id,
                "memory_id": e.chunk_id,
                "changes": changes,
                "created_at": to_rfc3339(e.created_at),
            })
        })
        .collect();
    Ok(Json(json!({"history": rows})))
}
