//! What every transport writes, and in what order: one op on one key (a
//! [`Query`]), which scripts a connection's server has cached ([`Loaded`]:
//! a script goes as EVAL on its first use, and again after NOSCRIPT), and
//! where a pipeline must end so that nothing overtakes an EVALSHA that may
//! meet NOSCRIPT ([`part_end`]), and which NOSCRIPT retry must not go
//! because a later op on its key already ran ([`overtaken`]). `rest` applies
//! them to each whole pipeline it sends; the connection engine's `pipe`,
//! which writes as the socket takes bytes and reads replies as they come,
//! keeps the same two rules as it goes (an EVAL or UNLINK is held behind
//! the EVALSHAs written before it, and `Pipe::overtaken` rejects a retry a
//! later op on its key has passed).

use super::scripts::Script;
use crate::ops::{Args, Op};

/// One op to run: on the state at `key` (prefix and suffix included).
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    pub key: &'a [u8],
    pub op: Op,
    pub args: Args,
}

impl<'a> Query<'a> {
    /// The keys the op works on: a step's every take's, else its one key.
    pub fn keys(&self) -> impl Iterator<Item = &'a [u8]> {
        let (one, step) = match self.op {
            Op::Takes => (None, Some(super::step::keys(self.key))),
            _ => (Some(self.key), None),
        };
        one.into_iter().chain(step.into_iter().flatten())
    }

    /// Whether the op works on `key`.
    pub fn names(&self, key: &[u8]) -> bool {
        self.keys().any(|k| k == key)
    }
}

/// The scripts a connection has sent as EVAL since its server last
/// answered NOSCRIPT: the server has them cached. Scripts are told apart by
/// address (each is one static).
#[derive(Default)]
pub struct Loaded(Vec<usize>);

impl Loaded {
    /// Whether `script` must go as EVAL, noting that it will.
    pub fn first_use(&mut self, script: &'static Script) -> bool {
        if self.has(script) {
            return false;
        }
        self.0.push(script as *const Script as usize);
        true
    }

    /// Whether `script` went as EVAL since the last NOSCRIPT.
    pub fn has(&self, script: &'static Script) -> bool {
        self.0.contains(&(script as *const Script as usize))
    }

    /// The server answered NOSCRIPT: its cache was flushed.
    pub fn forget(&mut self) {
        self.0.clear();
    }

    /// For each op about to go: whether it goes as EVAL (its script's first use).
    pub fn first_uses(&mut self, ops: impl Iterator<Item = Op>) -> Vec<bool> {
        ops.map(|op| op.script().is_some_and(|s| self.first_use(s)))
            .collect()
    }

    /// The cache was flushed, and these ops go again as EVAL, which loads
    /// their scripts.
    pub fn reloaded(&mut self, ops: impl Iterator<Item = Op>) {
        self.forget();
        for script in ops.filter_map(Op::script) {
            self.first_use(script);
        }
    }
}

/// Where the pipeline of the chosen ops from `start` ends: an UNLINK or an
/// EVAL (`evals` says which ops go as EVAL) can't meet NOSCRIPT, so it goes
/// only once the EVALSHAs before it have answered (and their retries run),
/// never overtaking one: after a SCRIPT FLUSH, a script's first use on this
/// connection would otherwise run before an older EVALSHA's retry.
pub fn part_end(queries: &[Query<'_>], chosen: &[usize], evals: &[bool], start: usize) -> usize {
    let mut end = start;
    let mut evalsha = false;
    while end < chosen.len() {
        let op = queries[chosen[end]].op;
        if waits_behind_evalsha(op, evals[end]) && evalsha {
            break;
        }
        evalsha |= op.script().is_some() && !evals[end];
        end += 1;
    }
    end
}

/// Whether an op (as EVAL if `eval`) must wait for the EVALSHAs written
/// before it to answer: an UNLINK or an EVAL cannot meet NOSCRIPT, so
/// written after an EVALSHA that does, it would run before that one's
/// retry. [`part_end`] ends a pipeline before it; the engine holds it.
pub fn waits_behind_evalsha(op: Op, eval: bool) -> bool {
    op == Op::Unlink || (eval && op.script().is_some())
}

/// Whether `waiting`, an op that met NOSCRIPT, is overtaken by `ran`, a
/// later op that ran: one of its keys is one of `ran`'s. [`overtaken`]
/// asks it of a whole pipeline; the engine, of each reply as it comes.
pub fn passes(ran: &Query<'_>, waiting: &Query<'_>) -> bool {
    waiting.keys().any(|k| ran.names(k))
}

/// For each op of one pipeline, in the order they were written, with
/// whether it met NOSCRIPT: whether it met NOSCRIPT and a later op on the
/// same key did not (a PING names no key). After a SCRIPT FLUSH another client can load the
/// script between two of them, and the later one runs; the earlier, sent
/// again, would take effect after it. It rejects instead, unsent
/// ([`Error::Overtaken`](crate::errors::Error::Overtaken)), so that the ops on
/// one key that take effect always do so in the order they were made.
pub fn overtaken(ops: &[(Query<'_>, bool)]) -> Vec<bool> {
    let mut ran: Vec<&Query<'_>> = Vec::new();
    let mut out = vec![false; ops.len()];
    for (j, (q, noscript)) in ops.iter().enumerate().rev() {
        match noscript {
            _ if q.op == Op::Ping => {}
            true => out[j] = ran.iter().any(|r| passes(r, q)),
            false => ran.push(q),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neither_an_eval_nor_an_unlink_shares_a_pipeline_behind_an_evalsha() {
        let q = |op| Query {
            key: b"p:a",
            op,
            args: [60_000, 1, 0, 0],
        };
        let queries = [q(Op::Consume), q(Op::Hit), q(Op::Unlink), q(Op::Hit)];
        let chosen = [0, 1, 2, 3];
        // The consume's script was loaded (EVALSHA); the hit's goes as EVAL.
        assert_eq!(
            part_end(&queries, &chosen, &[false, true, false, false], 0),
            1
        );
        assert_eq!(
            part_end(&queries, &chosen, &[false, true, false, false], 1),
            4
        );
        assert_eq!(
            part_end(&queries, &chosen, &[false, false, false, false], 0),
            2
        );
        // EVALs first, then EVALSHAs: nothing waits.
        assert_eq!(
            part_end(&queries, &chosen, &[true, true, false, false], 0),
            4
        );
    }

    #[test]
    fn a_noscript_op_is_overtaken_only_by_a_later_op_on_its_key_that_ran() {
        let q = |key: &'static [u8], op| Query {
            key,
            op,
            args: [60_000, 1, 0, 0],
        };
        let ops = [
            (q(b"p:a", Op::Hit), true),  // a later op on p:a ran
            (q(b"p:b", Op::Hit), true),  // only another NOSCRIPT on p:b follows
            (q(b"p:a", Op::Hit), false), // ran
            (q(b"p:b", Op::Hit), true),
            (q(b"p:c", Op::Hit), false), // ran, but nothing on p:c met NOSCRIPT before it
            (q(b"p:c", Op::Hit), true),  // nothing on p:c ran after it
            (q(b"p:", Op::Hit), true),   // a PING on the bare prefix names no key
            (q(b"p:", Op::Ping), false),
        ];
        let overtaken = overtaken(&ops);
        assert_eq!(
            overtaken,
            [true, false, false, false, false, false, false, false]
        );
        assert!(super::overtaken(&[]).is_empty());
    }
}
