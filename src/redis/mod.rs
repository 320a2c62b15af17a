//! redisStore: counters in Redis, shared by every instance of an app.
//!
//! `config` turns options and environment into a target, `link` keeps the
//! one multiplexed connection, `store` runs a hit (the window script), and
//! `batch` is the queue JavaScript drives, on the `runtime` thread.

pub mod batch;
pub mod config;
mod link;
mod runtime;
pub mod store;

pub use batch::{Batched, Completion};
pub use config::{Config, Options};
pub use store::{Hit, Query, Store};
