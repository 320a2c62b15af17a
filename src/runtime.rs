//! The one thread the threaded stores' I/O runs on (redisStore on Bun and
//! Deno, in a cluster and over REST; postgresStore, mysqlStore, sqliteStore
//! and their sweepers): a current-thread tokio runtime, started by the first
//! store that needs it and shared by every store (and worker thread) of the
//! process. A native thread never keeps Node.js alive. Sentinel discovery
//! runs on threads of its own, so it never holds the DNS pool.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};

use crate::errors::{Error, Result};

pub fn handle() -> Result<Handle> {
    static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();
    HANDLE
        .get_or_init(start)
        .clone()
        .ok_or(Error::Internal("could not start ratestore's I/O thread"))
}

fn start() -> Option<Handle> {
    let runtime = Builder::new_current_thread()
        .enable_all()
        // Only DNS look-ups block; they need no more than a couple of threads.
        .max_blocking_threads(2)
        .thread_name("ratestore-dns")
        .build()
        .ok()?;
    let handle = runtime.handle().clone();
    std::thread::Builder::new()
        .name("ratestore-io".into())
        .spawn(move || runtime.block_on(std::future::pending::<()>()))
        .ok()?;
    Some(handle)
}
