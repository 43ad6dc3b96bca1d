//! The ground floor: the memory record and its Arrow schema, ids, time, token
//! counting, the process's Prometheus metrics, a thread's scheduling priority, the caller (who is asking and which streams it may see) and the
//! error every service returns. Depends on nothing else in the crate.

pub mod caller;
pub mod error;
pub mod ids;
pub mod metrics;
pub mod model;
pub mod thread;
pub mod time;
pub mod tokens;
pub mod vector;

pub use caller::{Caller, Role};
pub use error::{Error, Result};
pub use ids::IdKey;
