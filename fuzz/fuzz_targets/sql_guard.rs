//! The SQL guard every query passes before it is planned.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = loomem::service::sql::check_query(text);
});
