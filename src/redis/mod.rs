//! redisStore: counters in Redis, shared by every instance of an app.
//!
//! `config` turns options and environment into a target. What every
//! transport shares: `calls` (an op on a key, the scripts cache, where a
//! pipeline ends so that nothing overtakes an EVALSHA), `reply` (a reply
//! to an answer or an error), `health` (backoff, stalls, demotions),
//! `order` (per-key turns), `fence` (`waitForReplicas`) and `stats`. The transports: `pipe` + `resp` +
//! `socket`, sans-I/O, driven on Node's event loop by the binding; `link`
//! (one multiplexed connection per server, or per node of a Redis Cluster,
//! whose slot map `cluster` keeps) and `rest` (Upstash's REST API), run by
//! `store` on the `runtime` thread, fed by `batch`, the queue JavaScript
//! drives.

pub mod batch;
pub mod calls;
mod cluster;
pub mod config;
pub mod conn;
pub mod fence;
pub mod health;
mod host;
mod link;
mod order;
pub mod pipe;
pub mod reply;
pub mod reset_all;
pub mod resp;
pub mod rest;
pub mod runtime;
pub mod socket;
pub mod stats;
pub mod store;

pub use batch::Batched;
pub use calls::Query;
pub use config::{Config, Options};
pub use store::Store;
