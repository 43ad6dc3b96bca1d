//! Starting and stopping the daemon: one function that takes a bound listener
//! and a shutdown future, so tests run the real thing on port 0.

use std::collections::HashMap;
use std::future::Future;

use tokio::net::TcpListener;

use crate::app::config::Config;
use crate::app::{Engine, StartError};

/// Start the engine and serve the API on `listener` until `shutdown` resolves;
/// then finish in-flight requests, drain the pipeline and flush the writer.
pub async fn serve(
    cfg: Config,
    env: HashMap<String, String>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let engine = Engine::start(cfg, &env).await?;
    let addr = listener.local_addr().ok();
    tracing::info!(?addr, bus = engine.bus.kind(), "loomem listening");
    let app = crate::api::router(engine.clone());
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "server error");
    }
    engine.shutdown().await;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received");
}
