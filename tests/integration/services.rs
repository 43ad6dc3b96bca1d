//! Service functions called directly, without a daemon: no HTTP server, no
//! nats-server. The engine runs on the embedded bus over real Lance tables in
//! a temp dir, and each test calls the functions the edges call.

use std::sync::Arc;

use loomem::app::config::Config;
use loomem::app::Engine;
use loomem::core::{Caller, Error};
use loomem::service::{context, conversation, dream, export, import, memory, search, Services};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::fixture::{daemon_env, Options};

/// A running engine on the embedded bus, with the temp dir it owns.
struct Local {
    engine: Arc<Engine>,
    _dir: tempfile::TempDir,
}

impl Local {
    async fn start() -> Local {
        let dir = tempfile::tempdir().unwrap();
        let (path, env) = daemon_env(&dir.path().join("data"), None, &Options::embedded());
        let engine = Engine::start(Config::load(&path, &env).unwrap(), &env)
            .await
            .unwrap();
        Local { engine, _dir: dir }
    }

    fn services(&self) -> &Services {
        &self.engine.services
    }

    async fn store(&self, caller: &Caller, body: Value) -> String {
        memory::store(self.services(), caller, req(body))
            .await
            .unwrap()
            .id
    }
}

/// A request struct from its JSON form (what the edges parse).
fn req<T: DeserializeOwned>(body: Value) -> T {
    serde_json::from_value(body).unwrap()
}

fn admin() -> Caller {
    Caller::admin("test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_get_history_delete_and_purge() {
    let l = Local::start().await;
    let s = l.services();
    let a = Caller::scoped("a", vec!["a".into()]);
    let id = l
        .store(
            &a,
            json!({"content": "The boiler is serviced every October"}),
        )
        .await;
    let got = memory::visible(s, &a, &id).await.unwrap();
    assert_eq!(
        (got.stream.as_str(), got.content.as_str()),
        ("a", "The boiler is serviced every October")
    );
    // Another key's memory is unknown, not forbidden.
    let b = Caller::scoped("b", vec!["b".into()]);
    assert!(matches!(
        memory::visible(s, &b, &id).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        memory::delete(s, &b, &id, None).await,
        Err(Error::NotFound(_))
    ));
    let history = memory::history(s, &a, &id, None).await.unwrap();
    assert_eq!(history.chunk_id, id);
    assert_eq!(history.versions.len(), 1);

    memory::delete(s, &a, &id, None).await.unwrap();
    assert!(matches!(
        memory::visible(s, &a, &id).await,
        Err(Error::NotFound(_))
    ));

    l.store(&a, json!({"content": "one"})).await;
    l.store(&a, json!({"content": "two"})).await;
    let dry = memory::purge(s, &a, req(json!({"stream": "a"})))
        .await
        .unwrap();
    assert_eq!((dry.dry_run, dry.deleted_ids.len()), (true, 2));
    assert_eq!(
        s.store
            .count(&loomem::store::Filter::new().stream("a"))
            .await
            .unwrap(),
        2
    );
    let gone = memory::purge(
        s,
        &a,
        req(json!({"stream": "a", "dry_run": false, "confirmed": true})),
    )
    .await
    .unwrap();
    assert_eq!(gone.deleted_count, 2);
    assert_eq!(
        s.store
            .count(&loomem::store::Filter::new().stream("a"))
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_ranks_the_match_first_and_keeps_to_the_callers_streams() {
    let l = Local::start().await;
    let s = l.services();
    let a = Caller::scoped("a", vec!["a".into()]);
    let want = l
        .store(
            &a,
            json!({"content": "Marta's violin lessons are on Thursday evenings"}),
        )
        .await;
    l.store(&a, json!({"content": "The recycling goes out on Mondays"}))
        .await;
    l.store(
        &admin(),
        json!({"content": "Violin strings were ordered for Marta", "stream": "other"}),
    )
    .await;
    let found = search::search(s, &a, req(json!({"query": "when are the violin lessons"})))
        .await
        .unwrap();
    assert_eq!(found.results[0].chunk_id, want);
    for r in &found.results {
        assert_eq!(memory_stream(s, &r.chunk_id).await, "a");
    }
    assert!(matches!(
        search::search(s, &a, req(json!({"query": "violin", "stream": "other"}))).await,
        Err(Error::Forbidden(_))
    ));
}

async fn memory_stream(s: &Services, id: &str) -> String {
    memory::visible(s, &admin(), id).await.unwrap().stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_pack_and_profile_stay_in_budget_and_in_the_stream() {
    let l = Local::start().await;
    let s = l.services();
    for i in 0..30 {
        l.store(
            &admin(),
            json!({"content": format!("Fact {i}: the greenhouse needs watering on day {i} of the month"), "stream": "g", "memory_type": "fact"}),
        )
        .await;
    }
    l.store(
        &admin(),
        json!({"content": "Secret of another stream", "stream": "h"}),
    )
    .await;
    let pack = context::context_pack(
        s,
        &admin(),
        req(json!({"query": "greenhouse watering", "stream": "g", "budget_tokens": 120})),
    )
    .await
    .unwrap();
    assert!(pack.total_tokens <= 120, "{} tokens", pack.total_tokens);
    assert!(loomem::core::tokens::count(&pack.context) <= 120);
    assert!(pack.context.contains("greenhouse"));
    assert!(!pack.context.contains("Secret"));
    let profile = context::profile(s, &admin(), Some("g")).await.unwrap();
    assert!(!profile.stable_facts.is_empty());
    assert!(profile
        .stable_facts
        .iter()
        .all(|f| f.content.contains("greenhouse")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_becomes_stored_facts() {
    let l = Local::start().await;
    let s = l.services();
    let out = conversation::ingest(
        s,
        &admin(),
        req(json!({
            "content": "User: I switched from VSCode to Cursor last week.\nAssistant: Nice!",
            "conversation_date": "2026-04-02",
            "stream": "c",
        })),
    )
    .await
    .unwrap();
    assert_eq!(out.status, "stored");
    assert!(!out.stored_ids.is_empty());
    let fact = memory::visible(s, &admin(), &out.stored_ids[0])
        .await
        .unwrap();
    assert_eq!(fact.stream, "c");
    assert!(fact.content.contains("Cursor"), "{}", fact.content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_restores_into_an_empty_engine() {
    let from = Local::start().await;
    let jsonl = (0..20)
        .map(|i| json!({"content": format!("Shelf {i} holds the {i}th atlas")}).to_string() + "\n")
        .collect::<String>();
    let report = import::import_text(
        import::Destination::services(from.services()),
        &admin(),
        import::Format::Jsonl,
        Some("lib"),
        &jsonl,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!((report.read, report.accepted), (20, 20));
    let all = loomem::store::Filter::new().stream("lib");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while from.services().store.count(&all).await.unwrap() < 20 {
        assert!(std::time::Instant::now() < deadline, "import never stored");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let limits = from.engine.cfg.sql.limits();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lib.jsonl");
    let size = export::Export {
        store: &from.services().store,
        caller: &admin(),
        limits: &limits,
        format: export::ExportFormat::Jsonl,
        sql: None,
    }
    .write_file(&file)
    .await
    .unwrap();
    let bytes = std::fs::read(&file).unwrap();
    assert_eq!(size, bytes.len() as u64);

    let to = Local::start().await;
    let text = String::from_utf8(bytes).unwrap();
    let restored = import::import_text(
        import::Destination::services(to.services()),
        &admin(),
        import::Format::LoomemJsonl,
        None,
        &text,
        |_, _| {},
    )
    .await
    .unwrap();
    assert!(restored.rejected.is_empty(), "{:?}", restored.rejected);
    let mut before = from.services().store.find(&all, None).await.unwrap();
    let mut after = to.services().store.find(&all, None).await.unwrap();
    before.sort_by(|a, b| a.id.cmp(&b.id));
    after.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(after.len(), 20);
    assert_eq!(before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dream_folds_near_copies_into_one_consolidated_memory() {
    let l = Local::start().await;
    let s = l.services();
    for text in [
        "My sister Ana lives in Lisbon",
        "My sister Ana lives in Lisbon now",
        "Ana, my sister, lives in Lisbon",
    ] {
        l.store(
            &admin(),
            json!({"content": text, "stream": "d", "subject": "ana", "memory_type": "fact"}),
        )
        .await;
    }
    l.store(
        &admin(),
        json!({"content": "The car needs new tyres", "stream": "d"}),
    )
    .await;
    let dry = dream::dream(s, &admin(), req(json!({"stream": "d", "dry_run": true})))
        .await
        .unwrap();
    assert!(dry.groups_found >= 1, "{dry:?}");
    assert_eq!(
        s.store
            .count(&loomem::store::Filter::new().stream("d").level(1))
            .await
            .unwrap(),
        0
    );
    let done = dream::dream(s, &admin(), req(json!({"stream": "d"})))
        .await
        .unwrap();
    assert_eq!(done.groups_found, dry.groups_found);
    assert!(done.facts_merged >= 2, "{done:?}");
    let l1 = s
        .store
        .find(&loomem::store::Filter::new().stream("d").level(1), None)
        .await
        .unwrap();
    assert_eq!(l1.len(), done.groups_found);
    assert!(l1[0].content.contains("Lisbon"), "{}", l1[0].content);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_outside_the_pipeline_wait_while_a_rollback_holds_the_tables() {
    let l = Local::start().await;
    let s = l.services();
    let kept = l
        .store(
            &admin(),
            json!({"content": "Keeps a sourdough starter", "stream": "a"}),
        )
        .await;
    let doomed = l
        .store(
            &admin(),
            json!({"content": "Owns a red bicycle", "stream": "a"}),
        )
        .await;
    let held = s.store.hold_writes().await;
    let feedback = tokio::spawn({
        let (engine, id) = (l.engine.clone(), kept.clone());
        async move {
            loomem::service::feedback::record(
                &engine.services,
                &admin(),
                req(json!({"chunk_id": id, "usefulness": 4})),
            )
            .await
        }
    });
    let delete = tokio::spawn({
        let (engine, id) = (l.engine.clone(), doomed.clone());
        async move { memory::delete(&engine.services, &admin(), &id, None).await }
    });
    // Neither lands while a rollback would be restoring the tables. (A wait
    // for something that must not happen: the window only has to be long
    // enough for a write that skipped the gate to land.)
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!feedback.is_finished() && !delete.is_finished());
    assert_eq!(s.store.feedback.tally(&kept).count, 0);
    assert!(s.store.get(&doomed).await.unwrap().is_some());
    drop(held);
    feedback.await.unwrap().unwrap();
    delete.await.unwrap().unwrap();
    assert_eq!(s.store.feedback.tally(&kept).count, 1);
    assert!(s.store.get(&doomed).await.unwrap().is_none());
}
