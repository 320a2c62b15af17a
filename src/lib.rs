//! ratestore: fixed-window rate-limit counters for Node.js.
//!
//! The core (`window`, `memory`, `redis`, `errors`, `clock`) knows nothing of N-API;
//! `binding` is the thin layer that converts to and from JavaScript.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bucket;
pub mod clock;
pub mod delivery;
pub mod errors;
pub mod histogram;
pub mod memory;
pub mod mysql;
pub mod ops;
pub mod postgres;
pub mod redis;
pub mod reset;
pub mod sliding;
pub mod sqlite;
pub mod step;
pub mod sweep;
pub mod tls;
pub mod window;
pub mod wtf8;

// napi-derive registers nothing in test builds, so the binding is left out there.
#[cfg(not(test))]
mod binding;
