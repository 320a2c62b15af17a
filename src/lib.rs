//! ratestore: rate-limit counters for Node.js (fixed window, sliding window,
//! token bucket).
//!
//! The core knows nothing of N-API: the algorithms (`window`, `sliding`,
//! `bucket`), the ops every store shares (`ops`), the stores (`memory`,
//! `redis`, `postgres`, `mysql`, `sqlite`), and what the threaded stores share
//! (`runtime`, the I/O thread; `health`, backoff and stalls; `tls`; `sweep`;
//! `delivery`), with `errors`, `clock` and `wtf8` (a key's bytes without loss,
//! lone surrogates included). `binding` is the thin layer that
//! converts to and from JavaScript.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bucket;
pub mod clock;
pub mod delivery;
pub mod errors;
pub mod health;
pub mod memory;
pub mod mysql;
pub mod ops;
pub mod postgres;
pub mod redis;
pub mod runtime;
pub mod sliding;
pub mod sqlite;
pub mod sweep;
pub mod tls;
pub mod window;
pub mod wtf8;

// napi-derive registers nothing in test builds, so the binding is left out there.
#[cfg(not(test))]
mod binding;
