//! The SQL stores' sweepers: a task on the I/O thread that deletes expired
//! rows every interval. It holds the store weakly, so it ends with the store
//! (or when the store is closed), and never keeps it alive.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Starts `store`'s sweeper (unless `every_ms` is 0): every `every_ms`,
/// while the store lives and `closed` says it is open, `sweep` runs once. A
/// sweep's failure (the connection lost, the server busy) is `sweep`'s to
/// drop; the next interval tries again.
pub fn start<S, F>(
    store: &Arc<S>,
    every_ms: u64,
    handle: &tokio::runtime::Handle,
    closed: impl Fn(&S) -> bool + Send + 'static,
    sweep: impl Fn(Arc<S>) -> F + Send + 'static,
) where
    S: Send + Sync + 'static,
    F: Future<Output = ()> + Send,
{
    if every_ms == 0 {
        return;
    }
    let weak: Weak<S> = Arc::downgrade(store);
    handle.spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(every_ms)).await;
            let Some(store) = weak.upgrade() else { return };
            if closed(&store) {
                return;
            }
            sweep(store).await;
        }
    });
}
