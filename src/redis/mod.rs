//! redisStore: counters in Redis, shared by every instance of an app.
//!
//! `config` turns options and environment into a target. What every
//! transport shares: `calls` (an op on a key, the scripts cache, where a
//! pipeline ends so that nothing overtakes an EVALSHA), `reply` (a reply
//! to an answer or an error), `scripts` (each op's Lua script,
//! key suffix and ARGV), `step` (several takes as one script), `reset`,
//! `order` (per-key turns), `fence` (`waitForReplicas`) and `stats`. One
//! connection engine, `conn` + `pipe` + `resp` + `socket`, has two hosts:
//! the binding's libuv glue on Node's event loop, and `host`, a tokio task
//! per connection on the I/O thread of `crate::runtime` (Bun, Deno, and every
//! node of a Redis Cluster, whose slot map and MOVED/ASK `cluster` and
//! `store` keep on top of per-node engines). `rest` speaks Upstash's REST
//! API. `store` runs them on the I/O thread, fed by `batch`, the queue
//! JavaScript drives.

pub mod batch;
pub mod calls;
mod cluster;
pub mod config;
pub mod conn;
pub mod fence;
pub mod histogram;
mod host;
mod order;
pub mod pipe;
pub mod reply;
pub mod reset;
pub mod reset_all;
pub mod resp;
pub mod rest;
pub mod scripts;
pub mod socket;
pub mod stats;
pub mod step;
pub mod store;

pub use batch::Batched;
pub use calls::Query;
pub use config::{Config, Options};
pub use store::Store;
