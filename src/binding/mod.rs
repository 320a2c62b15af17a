//! The N-API layer: converts arguments and results, nothing more. Functions
//! called rarely are `#[napi]`; the ones called on every hit are raw Node-API
//! callbacks (see `raw`), where the benchmark shows the difference.

mod memory;
mod mysql;
mod postgres;
mod raw;
mod redis;
mod redis_loop;
mod settle;
mod sqlite;
mod threaded;
mod uv;

use napi::bindgen_prelude::*;
use napi::JsString;
use napi_derive::napi;

use crate::errors::Error as CoreError;

/// The version of the crate this binary was built from; the loader refuses a
/// binary whose version differs from the JS package's.
#[napi]
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The ops' names in the order of their numbers (`Op::ALL`): `lib/ops.js`
/// numbers its `OP` by this list, so an op's number is defined once.
#[napi]
pub fn op_names() -> Vec<&'static str> {
    crate::ops::Op::ALL.iter().map(|op| op.name()).collect()
}

/// Throws the JS error for a core error from inside a `#[napi]` function,
/// and returns what tells napi-rs the exception is already pending. (If the
/// throw failed, napi-rs throws a plain Error with the same message.)
fn throw_core(env: &Env, err: CoreError) -> Error {
    // SAFETY: called on the JS thread inside a #[napi] callback of `env`.
    unsafe { raw::throw(env.raw(), &err) };
    Error::new(Status::PendingException, format!("ratestore: {err}"))
}

/// A string option that must be well-formed (no lone surrogates): a name or
/// prefix that lost a unit would be shared with another.
fn well_formed(value: JsString, what: &'static str) -> std::result::Result<String, CoreError> {
    // `as_str` refuses a lone surrogate (and leaves out the terminating NUL).
    value
        .into_utf16()
        .and_then(|units| units.as_str())
        .map_err(|_| CoreError::InvalidType(what))
}

/// Numbers per take of a step sent to a threaded store: its id, op, four
/// numbers and its key's length in UTF-16 units.
const TAKE_NUMBERS: usize = 7;

/// One take of a step as sent: its id, op, numbers and key.
type SentTake<'u> = (u32, crate::ops::Op, crate::ops::Args, &'u [u16]);

/// A step's takes from their numbers and their keys (one after another):
/// `(id, op, args, key units)` each, every op's numbers checked. The takes
/// themselves (how many, which ops) are checked by the store.
fn step_takes<'u>(
    numbers: &[f64],
    units: &'u [u16],
) -> std::result::Result<Vec<SentTake<'u>>, CoreError> {
    if !numbers.len().is_multiple_of(TAKE_NUMBERS) {
        return Err(CoreError::Internal("a step's numbers are not whole takes"));
    }
    let mut from = 0;
    let mut takes = Vec::with_capacity(numbers.len() / TAKE_NUMBERS);
    for n in numbers.chunks_exact(TAKE_NUMBERS) {
        let id = n[0];
        if !(id >= 0.0 && id <= f64::from(u32::MAX) && id.fract() == 0.0) {
            return Err(CoreError::Internal("a take's id is not an id"));
        }
        let op = crate::ops::Op::from_code(n[1]).ok_or(CoreError::InvalidRange(
            "a step's take must be a consume or a token bucket",
        ))?;
        let args = op.check([n[2], n[3], n[4], n[5]])?;
        let len = n[6];
        if !(len >= 0.0 && len.fract() == 0.0) {
            return Err(CoreError::Internal("a take's key length is not a length"));
        }
        let key = units
            .get(from..from + len as usize)
            .ok_or(CoreError::Internal(
                "the step's keys are not as long as told",
            ))?;
        from += len as usize;
        takes.push((id as u32, op, args, key));
    }
    if from != units.len() {
        return Err(CoreError::Internal(
            "the step's keys are not as long as told",
        ));
    }
    Ok(takes)
}

/// A step for a store whose keys are UTF-8 text (postgresStore, mysqlStore):
/// its takes' ids, and each take `(op, args, key)`, checked (1 to 16 takes,
/// each a consume, a sliding consume or a token bucket; `lone` the error of
/// a key with a lone surrogate, which would merge keys).
fn text_step(
    numbers: &[f64],
    keys: JsString,
    lone: &'static str,
) -> std::result::Result<(Vec<u32>, TextTakes), CoreError> {
    let units = keys
        .into_utf16()
        .map_err(|_| CoreError::InvalidType("keys must be a string"))?;
    let units = units.as_slice();
    let units = &units[..units.len().saturating_sub(1)];
    let sent = step_takes(numbers, units)?;
    crate::ops::check_step(sent.iter().map(|t| t.1))?;
    let mut ids = Vec::with_capacity(sent.len());
    let mut takes = Vec::with_capacity(sent.len());
    for (id, op, args, key) in sent {
        let key = String::from_utf16(key).map_err(|_| CoreError::InvalidType(lone))?;
        ids.push(id);
        takes.push((op, args, key));
    }
    Ok((ids, takes))
}

/// A step's takes with text keys.
type TextTakes = Vec<(crate::ops::Op, crate::ops::Args, String)>;

/// Each take's completion of a step that answered `result`.
fn step_completions(
    ids: &[u32],
    result: &std::result::Result<Vec<crate::ops::Answer>, CoreError>,
) -> Vec<crate::delivery::Completion> {
    ids.iter()
        .enumerate()
        .map(|(i, &id)| crate::delivery::Completion {
            id,
            result: match result {
                Ok(answers) => answers
                    .get(i)
                    .copied()
                    .ok_or(CoreError::Internal("a step answered too few takes")),
                Err(e) => Err(e.clone()),
            },
        })
        .collect()
}
