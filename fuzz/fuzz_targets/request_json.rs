//! Request bodies as the REST edge parses them, then validated as the
//! services do: any bytes are a value or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loomem::core::error::parse_json;
use loomem::core::Caller;
use loomem::service::{conversation, memory, search, sql};

fuzz_target!(|data: &[u8]| {
    let admin = Caller::admin("fuzz");
    if let Ok(req) = parse_json::<memory::StoreRequest>(data) {
        let _ = memory::chunk_from_request(&admin, req);
    }
    if let Ok(req) = parse_json::<conversation::IngestRequest>(data) {
        if let Some(text) = req.content {
            let _ = loomem::service::facts::parse_transcript(&text);
        }
    }
    let _ = parse_json::<search::SearchRequest>(data);
    if let Ok(req) = parse_json::<sql::SqlRequest>(data) {
        let _ = sql::check_query(&req.sql);
    }
});
