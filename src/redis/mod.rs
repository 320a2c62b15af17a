//! redisStore: counters in Redis, shared by every instance of an app.
//!
//! `config` turns options and environment into a target, `link` keeps one
//! multiplexed connection (per node of a Redis Cluster, whose slot map
//! `cluster` keeps), `rest` speaks Upstash's REST API instead, `health`
//! judges a connection (backoff, stalls, demotions), `store` runs a hit (the
//! window script), and `batch` is the queue JavaScript drives, on the
//! `runtime` thread.

pub mod batch;
mod cluster;
pub mod config;
pub mod health;
mod link;
mod order;
pub mod pipe;
pub mod reset_all;
pub mod resp;
pub mod rest;
pub mod runtime;
pub mod socket;
pub mod stats;
pub mod store;

pub use batch::{Batched, Completion};
pub use config::{Config, Options};
pub use store::{Query, Store};
