//! The lock of one shard. A hit holds it for tens of nanoseconds and a sweep
//! of the shard for a fraction of a millisecond, so a waiter spins and then
//! yields rather than sleep. Unlocking is a plain store, where std's futex
//! mutex needs a locked instruction that shows on every hit.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

pub struct SpinLock<T> {
    locked: AtomicBool,
    /// Set when a panic unwound through a holder: what it guards may be half changed.
    poisoned: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists at a time.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// A panic unwound through an earlier holder of the lock.
pub struct Poisoned;

impl<T> SpinLock<T> {
    pub fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    pub fn lock(&self) -> Result<Guard<'_, T>, Poisoned> {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 100 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        }
        let guard = Guard { lock: self };
        if self.poisoned.load(Ordering::Relaxed) {
            return Err(Poisoned);
        }
        Ok(guard)
    }
}

pub struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for Guard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard holds the lock.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.lock.poisoned.store(true, Ordering::Relaxed);
        }
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_take_turns() {
        let lock = Arc::new(SpinLock::new(0u64));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        *lock.lock().ok().unwrap() += 1;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*lock.lock().ok().unwrap(), 400_000);
    }

    #[test]
    fn a_panic_while_held_poisons() {
        let lock = Arc::new(SpinLock::new(0u64));
        let held = Arc::clone(&lock);
        let _ = std::thread::spawn(move || {
            let _guard = held.lock().ok().unwrap();
            panic!("while held");
        })
        .join();
        assert!(lock.lock().is_err());
    }
}
