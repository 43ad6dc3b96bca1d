//! The benches' log: `RUST_LOG=loomem=debug` shows the store's own timings
//! (commits, merges, index refreshes, each hot load's read and filing)
//! beside the figures.

/// Log to stderr as `RUST_LOG` says; nothing when it is unset.
pub fn init() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
}
