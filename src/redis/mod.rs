//! redisStore: counters in Redis, shared by every instance of an app.
//!
//! `config` turns options and environment into a target. What every
//! transport shares: `calls` (an op on a key, the scripts cache, and the
//! rules that keep anything from overtaking an EVALSHA), `reply` (a reply
//! to an answer or an error), `scripts` (each op's Lua script,
//! key suffix and ARGV), `step` (several takes as one script), `reset`,
//! `order` (per-key turns), `fence` (`waitForReplicas`) and `stats`. One
//! connection engine, `conn` + `pipe` + `resp` + `socket`, has two hosts:
//! the binding's libuv glue on Node's event loop, and `host`, a tokio task
//! per connection on the I/O thread of `crate::runtime` (Bun, Deno, and every
//! node of a Redis Cluster, whose slot map `cluster` keeps and whose
//! MOVED/ASK `routing` decides, with no I/O of its own, for `store` to
//! drive over per-node engines). `pair` (tests only) joins the engine to a
//! Redis server in memory, on time as a value. `rest` speaks Upstash's REST
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
#[cfg(test)]
mod pair;
pub mod pipe;
pub mod reply;
pub mod reset;
pub mod reset_all;
pub mod resp;
pub mod rest;
mod routing;
pub mod scripts;
pub mod socket;
pub mod stats;
pub mod step;
pub mod store;

pub use batch::Batched;
pub use calls::Query;
pub use config::{Config, Options};
pub use store::Store;
