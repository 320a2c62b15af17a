//! The lock of one shard. A hit holds it for tens of nanoseconds and a sweep
//! of the shard for a fraction of a millisecond, so a waiter spins and then
//! yields rather than sleep. Unlocking is a plain store, where std's futex
//! mutex needs a locked instruction that shows on every hit.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
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
        let guard = Guard {
            lock: self,
            _not_auto: PhantomData,
        };
        if self.poisoned.load(Ordering::Relaxed) {
            return Err(Poisoned);
        }
        Ok(guard)
    }
}

pub struct Guard<'a, T> {
    lock: &'a SpinLock<T>,
    /// Opts out of the auto traits: a guard derefs to `&T`, so it may be
    /// shared between threads only when `T` may (std's `MutexGuard` rule),
    /// whatever the lock's own `Sync` says. Not `Send` either, as std's.
    _not_auto: PhantomData<*const ()>,
}

// SAFETY: a shared guard gives out only `&T`, which other threads may hold when `T: Sync`.
unsafe impl<T: Sync> Sync for Guard<'_, T> {}

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
    use std::cell::Cell;
    use std::sync::Arc;

    /// Names `Guard<T>`'s `Sync` impl only when it exists: with two candidate
    /// impls, `_` cannot be inferred, and the check does not compile.
    trait AmbiguousIfSync<A> {
        fn check() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}

    /// Compiles only while a guard of a `!Sync` value (a `Cell`, which is
    /// `Send`) is not `Sync`; a guard of a `Sync` value still is.
    const _: fn() = || {
        <Guard<'static, Cell<u64>> as AmbiguousIfSync<_>>::check();
        fn sync<T: Sync>() {}
        sync::<Guard<'static, u64>>();
    };

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
