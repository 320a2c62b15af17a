//! memoryStore's binding. The hit runs on every request, so it is a raw
//! Node-API callback that takes one argument, the key, read into a stack
//! buffer. The numbers go both ways through the store's own `io` array
//! (memory Rust owns, see [`raw::Numbers`]): JavaScript leaves
//! `[windowMs, amount]` there, the hit takes them (leaving NaN) and leaves
//! `[resetMs, count]`. No JS value is read or made for a number (see "What a
//! hit costs" in the README).

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::{sys, JsString};
use napi_derive::napi;

use super::{raw, throw_core};
use crate::clock;
use crate::errors::Error;
use crate::memory::{self, Table};
use crate::ops::Op;
use crate::window;

/// Numbers in a store's `io`: a hit uses two, an op five in and up to six out.
const IO_LEN: usize = crate::ops::ANSWER_LEN;

/// Numbers in a store's `takesIo`: a step's count, then six per take (its
/// op, four numbers and its key's length) in; whether all allowed, then six
/// per take (its answer) out.
const TAKES_IO_LEN: usize = 1 + 6 * memory::MAX_TAKES;

/// What a hit function holds: its table and its numbers.
struct HitData {
    table: Arc<Table>,
    io: Arc<raw::Numbers>,
}

/// `memoryStore(maxKeys, name?)` → `{ hit(key), call, size, clear,
/// stats, close, io }`. `stats()` → `[held, capacity, calls, evictedEnded,
/// evictedShort, sweeps, swept]`.
#[napi(
    js_name = "memoryStore",
    ts_return_type = "{ hit(key: string): void; call(key: string): number | undefined; takes(keys: string): number | undefined; size(): number; clear(): void; stats(): number[]; close(): void; io: Float64Array; takesIo: Float64Array }"
)]
pub fn memory_store<'e>(
    env: &'e Env,
    max_keys: f64,
    name: Option<JsString<'e>>,
) -> Result<Object<'e>> {
    let open = || -> std::result::Result<(Arc<Table>, Option<String>), Error> {
        if !window::is_positive_safe_integer(max_keys) {
            return Err(Error::InvalidRange(
                "maxKeys must be a positive safe integer",
            ));
        }
        let name = match name {
            None => None,
            Some(name) => Some(super::well_formed(
                name,
                "name must be a well-formed string (no lone surrogates)",
            )?),
        };
        let table = memory::open(name.as_deref(), max_keys as usize)?;
        Ok((table, name))
    };
    let (table, name) = open().map_err(|e| throw_core(env, e))?;
    let io = raw::Numbers::new(IO_LEN);
    let takes_io = raw::Numbers::new(TAKES_IO_LEN);
    let size_of = Arc::clone(&table);
    let size =
        env.create_function_from_closure::<(), _, _>("size", move |_| Ok(size_of.len() as f64))?;
    let cleared = Arc::clone(&table);
    let clear = env.create_function_from_closure::<(), _, _>("clear", move |ctx| {
        cleared.clear().map_err(|e| throw_core(ctx.env, e))
    })?;
    let counted = Arc::clone(&table);
    let stats = env.create_function_from_closure::<(), _, _>("stats", move |ctx| {
        let s = counted.stats().map_err(|e| throw_core(ctx.env, e))?;
        let t = s.tally;
        Ok(vec![
            s.held as f64,
            s.capacity as f64,
            t.calls as f64,
            t.evicted_ended as f64,
            t.evicted_short as f64,
            s.sweeps as f64,
            t.swept as f64,
        ])
    })?;
    let closing = (Arc::clone(&table), std::cell::Cell::new(false));
    let close = env.create_function_from_closure::<(), _, _>("close", move |ctx| {
        let (table, closed) = &closing;
        if closed.replace(true) {
            return Ok(());
        }
        memory::close(name.as_deref(), table).map_err(|e| throw_core(ctx.env, e))
    })?;
    let data = || HitData {
        table: Arc::clone(&table),
        io: Arc::clone(&io),
    };
    // SAFETY: called on the JS thread inside this #[napi] callback; `hit`
    // and `call` read their data as the `HitData` given here.
    let made = unsafe {
        raw::function(env.raw(), "hit", hit, data()).and_then(|hit| {
            let call = raw::function(env.raw(), "call", call, data())?;
            Ok((hit, call, io.array(env.raw())?))
        })
    };
    let (hit, call, io) = made.map_err(|e| throw_core(env, e))?;
    let takes_data = HitData {
        table: Arc::clone(&table),
        io: Arc::clone(&takes_io),
    };
    // SAFETY: as above: `takes` reads its data as the `HitData` given here.
    let made = unsafe {
        raw::function(env.raw(), "takes", takes, takes_data)
            .and_then(|takes| Ok((takes, takes_io.array(env.raw())?)))
    };
    let (takes_fn, takes_io) = made.map_err(|e| throw_core(env, e))?;
    let mut store = Object::new(env)?;
    store.set("size", size)?;
    store.set("clear", clear)?;
    store.set("stats", stats)?;
    store.set("close", close)?;
    // A full store refuses with null (see `hit`): JavaScript makes the error
    // from this text.
    let full = format!("ratestore: {}", Error::StoreFull(max_keys as usize));
    store.set("fullMessage", full)?;
    // SAFETY: live values of this callback's scope.
    unsafe {
        store.set("hit", Unknown::from_raw_unchecked(env.raw(), hit))?;
        store.set("call", Unknown::from_raw_unchecked(env.raw(), call))?;
        store.set("io", Unknown::from_raw_unchecked(env.raw(), io))?;
        store.set("takes", Unknown::from_raw_unchecked(env.raw(), takes_fn))?;
        store.set("takesIo", Unknown::from_raw_unchecked(env.raw(), takes_io))?;
    }
    Ok(store)
}

/// `takes(keys)`, the keys of a step's takes one after another in one
/// string, with `takesIo = [n, then per take: op, a, b, c, d, keyLength]` →
/// `takesIo = [allowed, then per take its answer, six numbers]`: the takes
/// as one step (see `memory::multi`). Returns undefined only on failure.
unsafe extern "C" fn takes(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    // SAFETY: Node-API calls this on the JS thread with its own env and info.
    unsafe {
        raw::guard(env, || {
            let ([keys], data) = raw::args::<1>(env, info)?;
            // SAFETY: `data` is the HitData this function was made with,
            // owned by the function and freed only after it is collected.
            let HitData { table, io } = &*data.cast::<HitData>();
            let n = io.take(0);
            if !(n >= 1.0 && n <= memory::MAX_TAKES as f64 && n.fract() == 0.0) {
                return Err(Error::Internal(
                    "the step's numbers did not reach the store (its io array is detached?)",
                ));
            }
            let n = n as usize;
            let mut ops = Vec::with_capacity(n);
            for i in 0..n {
                let at = 1 + 6 * i;
                let op = Op::from_code(io.take(at)).ok_or(Error::InvalidRange(
                    "a step's take must be a consume or a token bucket",
                ))?;
                let numbers = [
                    io.take(at + 1),
                    io.take(at + 2),
                    io.take(at + 3),
                    io.take(at + 4),
                ];
                let len = io.take(at + 5);
                if !(len >= 0.0 && len.fract() == 0.0) {
                    return Err(Error::Internal("a take's key length is not a length"));
                }
                ops.push((op, op.check(numbers)?, len as usize));
            }
            let steps = raw::with_utf16(env, keys, "keys must be a string", |units| {
                let mut from = 0;
                let mut steps = Vec::with_capacity(n);
                for &(op, args, len) in &ops {
                    let key = units.get(from..from + len)?;
                    from += len;
                    steps.push(memory::Take {
                        key: table.key(key),
                        op,
                        args,
                    });
                }
                (from == units.len()).then_some(steps)
            })?
            .ok_or(Error::Internal("the step's keys are not as long as told"))?;
            let (allowed, answers) = table.run_takes(&steps, clock::now_us)?;
            io.set(0, f64::from(u8::from(allowed)));
            for (i, answer) in answers.iter().enumerate() {
                for (j, v) in answer.values.iter().enumerate() {
                    io.set(1 + 6 * i + j, *v as f64);
                }
            }
            raw::double(env, answers.len() as f64)
        })
    }
}

/// `call(key)` with `io = [op, a, b, c, d]` → how many numbers the op
/// answered, left in `io` (see `ops::Op`). Returns undefined only on failure.
unsafe extern "C" fn call(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    // SAFETY: Node-API calls this on the JS thread with its own env and info.
    unsafe {
        raw::guard(env, || {
            let ([key], data) = raw::args::<1>(env, info)?;
            // SAFETY: `data` is the HitData this function was made with,
            // owned by the function and freed only after it is collected.
            let HitData { table, io } = &*data.cast::<HitData>();
            let code = io.take(0);
            let numbers = [io.take(1), io.take(2), io.take(3), io.take(4)];
            let op = Op::from_code(code).ok_or(Error::Internal(
                "the call's numbers did not reach the store (its io array is detached?)",
            ))?;
            let args = op.check(numbers)?;
            let key = raw::with_utf16(env, key, "key must be a string", |k| table.key(k))?;
            let answer = table.run(key, clock::now_us, op, &args)?;
            for (i, v) in answer.values[..answer.len].iter().enumerate() {
                io.set(i, *v as f64);
            }
            raw::double(env, answer.len as f64)
        })
    }
}

/// `hit(key)` with `io = [windowMs, amount]` → `io = [resetMs, count]`.
/// Success is those two numbers: the hit takes its inputs (leaving NaN), and
/// only a hit that counted writes a resetMs, never negative, so JavaScript
/// never reads its own inputs back as an answer. A full store refuses with
/// `io[0] = -1` (`ERR_STORE_FULL`: JavaScript makes that error without a
/// stack trace, so that a stream of fresh keys against a full store stays
/// cheap). Any other failure throws, if it can, and leaves NaN. The function
/// returns no JS value: none is made per hit.
unsafe extern "C" fn hit(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    // SAFETY: Node-API calls this on the JS thread with its own env and info.
    unsafe {
        raw::guard(env, || {
            let ([key], data) = raw::args::<1>(env, info)?;
            // SAFETY: `data` is the HitData this function was made with,
            // owned by the function and freed only after it is collected.
            let HitData { table, io } = &*data.cast::<HitData>();
            let (window_ms, amount) = take_numbers(io)?;
            let key = raw::with_utf16(env, key, "key must be a string", |k| table.key(k))?;
            match table.hit(key, clock::now_us, window_ms, amount) {
                Ok(outcome) => {
                    io.set(1, outcome.count as f64);
                    // A safe integer (windowMs, or what is left of an open window, whose
                    // end is kept to 2^56 µs): the signed cast is exact and one instruction.
                    io.set(0, outcome.reset_ms as i64 as f64);
                }
                Err(Error::StoreFull(_)) => io.set(0, REFUSED),
                Err(e) => return Err(e),
            }
            Ok(std::ptr::null_mut())
        })
    }
}

/// What a full store leaves in `io[0]` for a refused hit: no resetMs is negative.
const REFUSED: f64 = -1.0;

/// A hit's numbers from its `io`. Each is taken once, so a hit whose
/// numbers never arrived (the array was detached or replaced) fails rather
/// than count with the last hit's.
fn take_numbers(io: &raw::Numbers) -> std::result::Result<(u64, i64), Error> {
    let (window_ms, amount) = (io.take(0), io.take(1));
    if amount.is_nan() {
        return Err(Error::Internal(
            "the hit's numbers did not reach the store (its io array is detached?)",
        ));
    }
    window::check(window_ms, amount)
}

/// `noopHitForBenchmark()` → `{ hit, io }`: for the benchmark's floor, a
/// native call that takes a hit's arguments the way memoryStore's does (the
/// key, and two numbers in its io) and answers them back, doing nothing else.
#[napi(
    js_name = "noopHitForBenchmark",
    ts_return_type = "{ hit(key: string): void; io: Float64Array }"
)]
pub fn noop_hit_for_benchmark(env: &Env) -> Result<Object<'_>> {
    let io = raw::Numbers::new(2);
    // SAFETY: called on the JS thread inside this #[napi] callback; `noop`
    // reads its data as the `Arc<Numbers>` given here.
    let made = unsafe {
        raw::function(env.raw(), "hit", noop, Arc::clone(&io))
            .and_then(|hit| Ok((hit, io.array(env.raw())?)))
    };
    let (hit, io) = made.map_err(|e| throw_core(env, e))?;
    let mut object = Object::new(env)?;
    // SAFETY: live values of this callback's scope.
    unsafe {
        object.set("hit", Unknown::from_raw_unchecked(env.raw(), hit))?;
        object.set("io", Unknown::from_raw_unchecked(env.raw(), io))?;
    }
    Ok(object)
}

unsafe extern "C" fn noop(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    // SAFETY: Node-API calls this on the JS thread with its own env and info.
    unsafe {
        raw::guard(env, || {
            let ([key], data) = raw::args::<1>(env, info)?;
            // SAFETY: `data` is the Arc<Numbers> this function was made with.
            let io = &*data.cast::<Arc<raw::Numbers>>();
            raw::with_utf16(env, key, "key must be a string", |k| k.len())?;
            let (window_ms, amount) = std::hint::black_box((io.take(0), io.take(1)));
            io.set(1, amount);
            io.set(0, window_ms);
            Ok(std::ptr::null_mut())
        })
    }
}
