//! Ingestion over a real nats-server: accepted vs stored, imports, redelivery,
//! dead letters, and riding out a NATS outage.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use loomem::bus::jetstream::{message_id, PACK_WRITES};
use loomem::bus::Envelope;
use loomem::core::model::Chunk;

use crate::fixture::{Daemon, Options};

/// Poll `GET /v1/status` until `pred` holds (or fail after `secs`).
pub(crate) async fn wait_status(
    d: &Daemon,
    secs: u64,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let (_, st) = d.call("GET", "/v1/status", None).await;
        if pred(&st) {
            return st;
        }
        assert!(
            started.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}: {st}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn publish_raw(d: &Daemon, subject: &str, msg_id: &str, payload: Vec<u8>) {
    let client = async_nats::connect(d.nats.as_ref().unwrap().url())
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let msg = async_nats::jetstream::message::PublishMessage::build()
        .payload(payload.into())
        .message_id(msg_id);
    js.send_publish(subject.to_string(), msg)
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_false_answers_accepted_and_the_memory_is_then_stored() {
    let d = Daemon::start(Options::default()).await;
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "Accepted first, stored soon", "stream": "w", "wait": false})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["status"], "accepted");
    wait_status(&d, 20, "the memory to be stored", |st| st["chunks"] == 1).await;
    let id = body["id"].as_str().unwrap().to_string();
    assert_eq!(
        d.search_ids(json!({"query": "accepted stored", "stream": "w"}))
            .await,
        vec![id]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_import_reports_rejections_and_resumes_without_duplicates() {
    let d = Daemon::start(Options::default()).await;
    let file = "{\"content\":\"Alice owns a red bicycle\"}\n{\"content\":\"\"}\n{\"content\":\"Bob plays the cello\",\"id\":\"bob-1\"}\n{\"content\":\"Carol speaks Polish\"}\n{oops\n";
    let import = || async {
        let resp = d
            .http
            .post(format!("{}/v1/import?format=jsonl&stream=imp", d.url))
            .body(file)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        resp.json::<Value>().await.unwrap()
    };
    let report = import().await;
    assert_eq!(report["read"], 5);
    assert_eq!(report["accepted"], 3);
    let lines: Vec<u64> = report["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, vec![2, 5]);
    wait_status(&d, 20, "3 imported memories", |st| st["chunks"] == 3).await;

    // Re-running the same import (an interrupted one, say) adds nothing.
    let again = import().await;
    assert_eq!(
        again["accepted"].as_u64().unwrap() + again["duplicates"].as_u64().unwrap(),
        3
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 3);
    assert_eq!(
        d.search_ids(json!({"query": "cello", "stream": "imp"}))
            .await,
        vec!["bob-1".to_string()]
    );

    let (s, body) = d
        .call_as(None, "POST", "/v1/import?format=yaml", Some(json!({})))
        .await;
    assert_eq!(s, 422, "{body}");
    assert!(body["detail"].as_str().unwrap().starts_with("format:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_write_never_duplicates_a_memory() {
    let d = Daemon::start(Options::default()).await;
    let id = d.store("The boiler was serviced in May", "r").await;
    // The same write delivered again (as after a crash between commit and ack),
    // under a message id JetStream has not seen, so it really is delivered.
    let mut chunk = Chunk::new(
        id.clone(),
        "r".into(),
        "The boiler was serviced in May".into(),
        1,
    );
    chunk.created_at = loomem::core::model::now_micros();
    let env = Envelope {
        pipeline: "store".into(),
        chunk,
        notify: false,
        minted: false,
        resend: 0,
    };
    for i in 0..3 {
        publish_raw(
            &d,
            "loomem.in.r",
            &format!("replay-{i}"),
            serde_json::to_vec(&env).unwrap(),
        )
        .await;
    }
    wait_status(&d, 20, "the replays to be processed", |st| {
        st["pipelines"]["store"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["stage"] == "write"))
            .and_then(|w| w["records_out"].as_u64())
            == Some(4)
    })
    .await;
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 1);
    assert_eq!(
        d.search_ids(json!({"query": "boiler serviced", "stream": "r"}))
            .await,
        vec![id]
    );
}

/// Two writes to the store pipeline of `stream`: `bad-vector`, decodable but
/// with a 3-dimensional vector a 384-d table cannot take, then `good-one`.
fn bad_and_good(stream: &str) -> Vec<Envelope> {
    let mut bad = Chunk::new(
        "bad-vector".into(),
        stream.into(),
        "vector of the wrong size".into(),
        1,
    );
    bad.embedding = Some(vec![0.1, 0.2, 0.3]);
    bad.embed_model = Some("hash-384".into());
    let good = Chunk::new(
        "good-one".into(),
        stream.into(),
        "a perfectly good memory".into(),
        1,
    );
    [bad, good]
        .into_iter()
        .map(|chunk| Envelope {
            pipeline: "store".into(),
            chunk,
            notify: false,
            minted: false,
            resend: 0,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_end_in_dead_letters_and_spare_their_batch() {
    let d = Daemon::start(Options::default().env("LOOMEM_BUS__MAX_DELIVER", "2")).await;
    // Undecodable bytes.
    publish_raw(&d, "loomem.in.p", "garbage-1", b"{not an envelope".to_vec()).await;
    for env in bad_and_good("p") {
        let payload = serde_json::to_vec(&env).unwrap();
        publish_raw(
            &d,
            "loomem.in.p",
            &message_id(&env.chunk.id, &payload),
            payload,
        )
        .await;
    }
    let st = wait_status(&d, 30, "two dead letters", |st| st["dead_letters"] == 2).await;
    assert_eq!(st["chunks"], 1, "{st}");
    assert_eq!(
        d.search_ids(json!({"query": "perfectly good", "stream": "p"}))
            .await,
        vec!["good-one".to_string()]
    );
    // Purging the stream takes its dead letters (they quote what was written)
    // too; the undecodable message names no stream and stays for the admin.
    let (s, body) = d
        .call(
            "POST",
            "/v1/purge-namespace",
            Some(json!({"stream": "p", "dry_run": false, "confirmed": true})),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["dead_letters"], 1, "{st}");
    let left = d
        .sql("SELECT count(*) AS n FROM dead_letters WHERE stream IS NULL")
        .await;
    assert_eq!(left[0]["n"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_down_is_a_fast_503_and_the_daemon_recovers_by_itself() {
    let mut d = Daemon::start(Options::default()).await;
    d.store("before the outage", "n").await;
    d.nats.as_mut().unwrap().stop();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "during the outage", "stream": "n"})),
        )
        .await;
    assert_eq!(s, 503, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("NATS"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "503 took {:?}",
        started.elapsed()
    );
    // Reads keep working during the outage.
    assert_eq!(
        d.search_ids(json!({"query": "before outage", "stream": "n"}))
            .await
            .len(),
        1
    );

    d.nats.as_mut().unwrap().restart();
    let started = Instant::now();
    loop {
        let (s, _) = d
            .call(
                "POST",
                "/v1/store",
                Some(json!({"content": "after the outage", "stream": "n", "id": "after-1"})),
            )
            .await;
        if s == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no recovery: last status {s}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Searchable again (both memories match; ranking is not what this tests).
    assert!(d
        .search_ids(json!({"query": "after outage", "stream": "n"}))
        .await
        .contains(&"after-1".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_bus_has_the_same_semantics() {
    let d = Daemon::start(Options::embedded()).await;
    let id = d.store("Stored through the in-process bus", "e").await;
    assert_eq!(
        d.search_ids(json!({"query": "in-process bus", "stream": "e"}))
            .await,
        vec![id]
    );
    let (s, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "not waited for", "stream": "e", "wait": false})),
        )
        .await;
    assert_eq!((s, body["status"].as_str()), (200, Some("accepted")));
    wait_status(&d, 10, "the second memory", |st| st["chunks"] == 2).await;
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["bus"]["kind"], "embedded");
}

/// How many memories a daemon's import pipeline wrote, from its status.
pub(crate) fn import_written(status: &Value) -> u64 {
    status["pipelines"]["import"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["stage"] == "write"))
        .and_then(|w| w["records_out"].as_u64())
        .unwrap_or(0)
}

/// Both daemons committed some of the imports (they share one consumer).
pub(crate) async fn both_wrote(a: &Daemon, b: &Daemon) {
    let (_, sa) = a.call("GET", "/v1/status", None).await;
    let (_, sb) = b.call("GET", "/v1/status", None).await;
    let (wa, wb) = (import_written(&sa), import_written(&sb));
    assert!(wa > 0 && wb > 0, "a wrote {wa}, b wrote {wb}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_share_the_consumer_and_the_data_dir() {
    const N: usize = 1500;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let nats = crate::nats::NatsServer::start(&dir.path().join("nats"));
    let url = nats.url();
    let opts = Options::default()
        .env("LOOMEM_BUS__BATCH_SIZE", "50")
        .env("LOOMEM_STORAGE__READ_CONSISTENCY_MS", "0");
    let a = Daemon::start_with(&data, Some(nats), opts.clone()).await;
    let b = Daemon::start_with(&data, Some(crate::nats::NatsServer::external(&url)), opts).await;

    let file: String = (0..N)
        .map(|i| {
            format!(
                "{{\"content\":\"shared work item {i} for worker pool {}\"}}\n",
                i % 7
            )
        })
        .collect();
    let (s, report) = a
        .post_raw("/v1/import?format=jsonl&stream=pool", file.into_bytes())
        .await;
    assert_eq!(s, 200, "{report}");
    // Both processes see all of them (shared data dir) …
    for d in [&a, &b] {
        wait_status(d, 120, "all memories", |st| st["chunks"] == N).await;
    }
    // … and both did part of the work.
    both_wrote(&a, &b).await;
    let (_, sa) = a.call("GET", "/v1/status", None).await;
    assert_eq!(sa["dead_letters"], 0);
}

/// The pipeline's durable consumer on the daemon's JetStream, to read its
/// delivery and acknowledgement counts.
async fn pipeline_consumer(d: &Daemon) -> async_nats::jetstream::consumer::PullConsumer {
    let client = async_nats::connect(d.nats.as_ref().unwrap().url())
        .await
        .unwrap();
    async_nats::jetstream::new(client)
        .get_consumer_from_stream("loomem-pipeline", "LOOMEM")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_slower_than_the_ack_deadline_is_kept_in_progress_not_redelivered() {
    let llm = crate::llm_stub::stub_llm().await;
    let d = Daemon::start(
        Options::default()
            .env("LOOMEM_LLM__BASE_URL", &llm.url)
            .env("LOOMEM_LLM__MODEL", "stub-chat-1")
            .env("LOOMEM_BUS__ACK_WAIT_MS", "1000"),
    )
    .await;
    llm.answer(
        "contradiction_judgement",
        &json!({"superseded": [], "reason": "unrelated"}).to_string(),
    );
    d.store("I live in Boston", "slow").await;
    // The judge inside the pipeline now takes 3.5 ack deadlines.
    llm.delay(3500);
    let (status, body) = d
        .call(
            "POST",
            "/v1/store",
            Some(json!({"content": "I live in Chicago", "stream": "slow"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "stored", "{body}");
    assert_eq!(llm.requests_for("contradiction_judgement").len(), 1);

    // JetStream never redelivered: the worker reported the batch in progress.
    let mut consumer = pipeline_consumer(&d).await;
    let info = consumer.info().await.unwrap();
    // Every delivery bumps the consumer sequence; a redelivery does so again
    // for the same stream message.
    assert_eq!(info.delivered.stream_sequence, 2, "{info:?}");
    assert_eq!(info.delivered.consumer_sequence, 2, "{info:?}");
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["dead_letters"], 0, "{st}");
    assert_eq!(st["chunks"], 2, "{st}");
}

/// A store is answered once its memory is committed; its entity-graph rows
/// go in a later group commit, and its message is acknowledged only after
/// that. Every message ends acknowledged, none delivered twice, and the
/// graph holds every mention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_acknowledged_once_their_graph_rows_are_committed() {
    let d = Daemon::start(Options::default()).await;
    let texts = [
        "Alice uses Cursor for the billing service",
        "Alice moved the billing service to Kubernetes",
        "Bob reviews what Alice ships on Kubernetes",
        "Alice and Bob pair on Fridays",
    ];
    let stores = texts.iter().map(|t| d.store(t, "graph-acks"));
    futures::future::join_all(stores).await;
    // Read at once: a read of the graph waits for the queue.
    let (s, e) = d
        .call("GET", "/v1/graph/entity/alice?stream=graph-acks", None)
        .await;
    assert_eq!(s, 200, "{e}");
    assert_eq!(e["entity"]["chunk_count"], 4, "{e}");

    let info = all_acknowledged(&d).await;
    assert_eq!(info.ack_floor.stream_sequence, 4, "{info:?}");
    assert_eq!(
        info.delivered.consumer_sequence, 4,
        "none delivered twice: {info:?}"
    );
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["chunks"], 4, "{st}");
    assert_eq!(st["dead_letters"], 0, "{st}");
}

/// The worker holds two batches at once (the next one embeds while the one
/// before is written); the stages that read the store still see every batch
/// before theirs, duplicates and updates included, and writes land in the
/// order they were published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_dedupe_against_each_other_and_land_in_order() {
    let d = Daemon::start(Options::default().env("LOOMEM_BUS__BATCH_SIZE", "2")).await;
    let store = |body: Value| {
        let d = &d;
        async move {
            let (s, resp) = d.call("POST", "/v1/store", Some(body)).await;
            assert_eq!(s, 200, "{resp}");
            resp
        }
    };
    // Each note twice, back to back: the copy lands in the same batch or in
    // the next one, never unnoticed.
    for i in 0..15 {
        for _ in 0..2 {
            store(json!({"content": format!("Garden note {i}: the tulips by the shed need water"), "stream": "g", "wait": false})).await;
        }
        // The same id rewritten: the later text must win.
        store(json!({"id": "plan", "content": format!("The plan is revision {i}"), "stream": "g", "wait": false})).await;
    }
    // A fact and its update a batch or two apart: the update supersedes it.
    store(json!({"content": "Alice uses VSCode as her editor", "stream": "g", "wait": false}))
        .await;
    store(json!({"content": "The shed door sticks in the rain", "stream": "g", "wait": false}))
        .await;
    store(json!({"content": "Alice switched from VSCode to Cursor as her editor", "stream": "g", "wait": false})).await;
    // Published last and stored in order: once it is stored, so is everything before.
    let last = store(json!({"content": "The sentinel is stored last", "stream": "g"})).await;
    assert_eq!(last["status"], "stored", "{last}");
    let rows = d
        .sql("SELECT count(*) AS n FROM chunks WHERE stream = 'g' AND content LIKE 'Garden note%'")
        .await;
    assert_eq!(rows[0]["n"], 15, "one memory per note");
    let plan = d.sql("SELECT content FROM chunks WHERE id = 'plan'").await;
    assert_eq!(plan[0]["content"], "The plan is revision 14");
    let old = d
        .sql("SELECT superseded_by FROM chunks WHERE content = 'Alice uses VSCode as her editor'")
        .await;
    assert_eq!(old.len(), 1, "{old:?}");
    assert!(
        old[0]["superseded_by"].is_string(),
        "the update superseded it: {old:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_of_the_same_id_and_text_is_not_taken_for_a_retry() {
    let d = Daemon::start(Options::default().env("LOOMEM_SERVER__STORE_TIMEOUT_MS", "10000")).await;
    let body =
        json!({"id": "again", "content": "The spare key is under the blue pot", "stream": "s"});
    let (s, r) = d.call("POST", "/v1/store", Some(body.clone())).await;
    assert_eq!((s, r["status"].clone()), (200, json!("stored")), "{r}");
    let (s, r) = d
        .call("POST", "/v1/delete", Some(json!({"id": "again"})))
        .await;
    assert_eq!(s, 200, "{r}");
    // The same id and text, well within JetStream's duplicate window: a new
    // write, not a retry of the first.
    let (s, r) = d.call("POST", "/v1/store", Some(body.clone())).await;
    assert_eq!((s, r["status"].clone()), (200, json!("stored")), "{r}");
    let rows = d.sql("SELECT id FROM chunks WHERE id = 'again'").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    // A plain retry of a stored write is answered without storing twice.
    let (s, r) = d.call("POST", "/v1/store", Some(body)).await;
    assert_eq!((s, r["status"].clone()), (200, json!("stored")), "{r}");
    let rows = d.sql("SELECT id FROM chunks WHERE id = 'again'").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    // The same text with another field changed is an update, not a retry.
    let update = json!({"id": "again", "content": "The spare key is under the blue pot", "stream": "s", "title": "Keys"});
    let (s, r) = d.call("POST", "/v1/store", Some(update)).await;
    assert_eq!((s, r["status"].clone()), (200, json!("stored")), "{r}");
    let rows = d.sql("SELECT title FROM chunks WHERE id = 'again'").await;
    assert_eq!(rows, vec![json!({"title": "Keys"})]);

    let d = &d;
    // An import line is the very same message each time it is sent: sent
    // again it is a duplicate while stored, and stored again once deleted.
    let line = json!({"id": "imported", "content": "The gate code is 4471", "created_at": "2024-05-01T10:00:00Z"});
    let import = || {
        d.post_raw(
            "/v1/import?format=jsonl&stream=s",
            line.to_string().into_bytes(),
        )
    };
    let wait_rows = |want: usize| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let rows = d.sql("SELECT id FROM chunks WHERE id = 'imported'").await;
            if rows.len() == want {
                break;
            }
            assert!(Instant::now() < deadline, "{rows:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (s, r) = import().await;
    assert_eq!((s, r["accepted"].clone()), (200, json!(1)), "{r}");
    wait_rows(1).await;
    let (_, r) = import().await;
    assert_eq!(
        (r["accepted"].clone(), r["duplicates"].clone()),
        (json!(0), json!(1)),
        "{r}"
    );
    let (s, r) = d
        .call("POST", "/v1/delete", Some(json!({"id": "imported"})))
        .await;
    assert_eq!(s, 200, "{r}");
    let (_, r) = import().await;
    assert_eq!(
        (r["accepted"].clone(), r["duplicates"].clone()),
        (json!(1), json!(0)),
        "{r}"
    );
    wait_rows(1).await;
}

/// Wait until the pipeline's consumer has every message acknowledged, and
/// return its info then.
async fn all_acknowledged(d: &Daemon) -> async_nats::jetstream::consumer::Info {
    let mut consumer = pipeline_consumer(d).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = consumer.info().await.unwrap().clone();
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "messages still unacknowledged: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An import's writes travel up to `PACK_WRITES` to a message (one message
/// a write made JetStream store, deliver and take an acknowledgement for
/// each); every write is stored once, and every message acknowledged once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_travels_in_packs_and_every_write_is_stored_once() {
    let d = Daemon::start(Options::default()).await;
    let n = 2 * PACK_WRITES + 88;
    let file: String = (0..n)
        .map(|i| {
            json!({"content": format!("Pack note {i}: the heron {i} came back")}).to_string() + "\n"
        })
        .collect();
    let (status, report) = d
        .post_raw("/v1/import?format=jsonl&stream=packs", file.into_bytes())
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["accepted"], n, "{report}");
    wait_status(&d, 60, "every imported memory", |st| st["chunks"] == n).await;
    let info = all_acknowledged(&d).await;
    // Two full packs and one of 88.
    assert_eq!(info.delivered.stream_sequence, 3, "{info:?}");
    assert_eq!(
        info.delivered.consumer_sequence, 3,
        "none delivered twice: {info:?}"
    );
    let (_, st) = d.call("GET", "/v1/status", None).await;
    assert_eq!(st["dead_letters"], 0, "{st}");
    let (_, found) = d
        .call(
            "POST",
            "/v1/search",
            Some(json!({"query": "Pack note 117", "stream": "packs", "top_k": 1})),
        )
        .await;
    let top = found["results"][0]["content"].as_str().unwrap_or_default();
    assert!(top.contains("heron 117"), "{found}");
}

/// A pack whose one write fails: the message is delivered again whole, the
/// good write is stored once all the same, the bad one ends in
/// `dead_letters` after `max_deliver` attempts, and then the message is
/// acknowledged. A pack that does not decode is one dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_with_a_failing_write_is_delivered_again_whole_then_settled() {
    let d = Daemon::start(Options::default().env("LOOMEM_BUS__MAX_DELIVER", "2")).await;
    publish_raw(
        &d,
        "loomem.in.pk",
        "garbage-pack",
        b"[{\"pipeline\": 1".to_vec(),
    )
    .await;
    let pack = bad_and_good("pk");
    publish_raw(
        &d,
        "loomem.in.pk",
        "a-pack",
        serde_json::to_vec(&pack).unwrap(),
    )
    .await;
    let st = wait_status(&d, 30, "two dead letters", |st| st["dead_letters"] == 2).await;
    assert_eq!(st["chunks"], 1, "{st}");
    let info = all_acknowledged(&d).await;
    // The garbage once; the pack twice (its bad write was retried).
    assert_eq!(info.delivered.consumer_sequence, 3, "{info:?}");
    assert_eq!(
        d.search_ids(json!({"query": "perfectly good", "stream": "pk"}))
            .await,
        vec!["good-one".to_string()]
    );
    let dead = d
        .sql("SELECT memory_id FROM dead_letters ORDER BY memory_id")
        .await;
    assert_eq!(dead[0]["memory_id"], "bad-vector", "{dead:?}");
    assert!(dead[1]["memory_id"].is_null(), "{dead:?}");
}
