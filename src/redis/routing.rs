//! Redis Cluster routing of hits sent together, apart from any I/O, in the
//! shape of the connection engine: the host asks for the pipelines to send
//! ([`Routing::parts`]), sends each on its node's engine, hands each part's
//! results back ([`Routing::answered`]) and asks again, until no part is
//! left; then [`Routing::finish`] gives every hit its result, in order.
//! A hit whose script did not run (MOVED, ASK) goes to the node named, at
//! most [`MAX_REDIRECTS`] times; nothing else is ever sent again. Trouble
//! with a node, or a MOVED, says the slot map is to be asked for again
//! ([`Routing::take_stale`]). The host ([`super::store`]) drives it on the
//! I/O thread; its tests drive it over engines in memory
//! ([`super::pair`]).

use super::reply::{Answers, Code};
use crate::errors::{Error, Result};

/// Redirections one hit may follow (a slot that moves twice while a hit is
/// under way is already rare).
pub const MAX_REDIRECTS: usize = 5;

/// A node as the routing sees it: what tells two handles of one node.
pub trait NodeRef: Clone {
    fn same(&self, other: &Self) -> bool;
}

/// One pipeline to send: the hits (by their index in the call) for one
/// node, each after `ASKING` if `asking`.
#[derive(Debug)]
pub struct Part<N> {
    pub node: N,
    pub asking: bool,
    pub hits: Vec<usize>,
}

/// The routing of one call of hits.
pub struct Routing<N> {
    results: Vec<Option<Result<Answers>>>,
    /// Hits to send next: each one's index, node and whether after ASKING.
    pending: Vec<(usize, N, bool)>,
    /// Rounds of parts sent so far.
    rounds: usize,
    stale: bool,
    redirections: u64,
}

impl<N: NodeRef> Routing<N> {
    /// Each hit's node, as the slot map says; a hit whose slot no node
    /// serves fails alone (CLUSTERDOWN), and the map is to be asked for again.
    pub fn new(nodes: impl IntoIterator<Item = Option<N>>) -> Routing<N> {
        let mut routing = Routing {
            results: Vec::new(),
            pending: Vec::new(),
            rounds: 0,
            stale: false,
            redirections: 0,
        };
        for (i, node) in nodes.into_iter().enumerate() {
            match node {
                Some(node) => {
                    routing.results.push(None);
                    routing.pending.push((i, node, false));
                }
                None => {
                    routing.results.push(Some(Err(Error::Redis(
                        "CLUSTERDOWN the key's slot is not served by any node".into(),
                    ))));
                    routing.stale = true;
                }
            }
        }
        routing
    }

    /// The pipelines to send now, one per node (and per ASK or not), each
    /// to be answered through [`Routing::answered`]; none once every hit
    /// has its result.
    pub fn parts(&mut self) -> Vec<Part<N>> {
        let mut parts: Vec<Part<N>> = Vec::new();
        for (i, node, asking) in self.pending.drain(..) {
            match parts
                .iter_mut()
                .find(|p| p.node.same(&node) && p.asking == asking)
            {
                Some(part) => part.hits.push(i),
                None => parts.push(Part {
                    node,
                    asking,
                    hits: vec![i],
                }),
            }
        }
        if !parts.is_empty() {
            self.rounds += 1;
        }
        parts
    }

    /// A part's results, in its hits' order. `redirected` gives the node a
    /// redirection names (`host:port`), or why there is none.
    pub fn answered(
        &mut self,
        part: &Part<N>,
        results: impl IntoIterator<Item = Result<Answers>>,
        mut redirected: impl FnMut(&str) -> Result<N>,
    ) {
        // The parts of round r (from 1) may follow MAX_REDIRECTS - (r - 1) more.
        let redirects_left = MAX_REDIRECTS.saturating_sub(self.rounds.saturating_sub(1));
        let mut results = results.into_iter();
        for &i in &part.hits {
            let result = results
                .next()
                .unwrap_or(Err(Error::Internal("a call got no answer")));
            let (next, stale) = next_step(&result, redirects_left);
            self.stale |= stale;
            let given = match next {
                Next::Redirect { to, asking } => {
                    self.redirections += 1;
                    match redirected(to) {
                        Ok(node) => {
                            self.pending.push((i, node, asking));
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                }
                Next::Give => result,
            };
            self.results[i] = Some(given);
        }
    }

    /// Whether the slot map is to be asked for again, since last asked.
    pub fn take_stale(&mut self) -> bool {
        std::mem::take(&mut self.stale)
    }

    /// Redirections followed since last asked.
    pub fn take_redirections(&mut self) -> u64 {
        std::mem::take(&mut self.redirections)
    }

    /// Every hit's result, in order.
    pub fn finish(self) -> Vec<Result<Answers>> {
        self.results
            .into_iter()
            .map(|r| r.unwrap_or(Err(Error::Internal("a call got no answer"))))
            .collect()
    }
}

/// The error a hit's result says its node is in trouble with (it failed,
/// or no longer holds the slot): the slot map is asked for again.
fn node_trouble(result: &Result<Answers>) -> bool {
    match result {
        Ok(_) => false,
        Err(Error::Redis(text)) => text
            .split(' ')
            .next()
            .is_some_and(|code| Code::of(code).node_trouble()),
        Err(Error::Timeout { .. } | Error::Connection { .. } | Error::BackingOff { .. }) => true,
        Err(_) => false,
    }
}

/// What becomes of one hit's result in a cluster.
#[derive(Debug, PartialEq, Eq)]
enum Next<'a> {
    /// Sent again, to the node a MOVED or ASK names (its script did not run).
    Redirect { to: &'a str, asking: bool },
    /// Given to its caller.
    Give,
}

/// The rule for one hit's result: a MOVED or ASK is followed while
/// `redirects_left`, anything else is given; and whether the slot map is
/// to be asked for again (a MOVED, followed or not, or trouble with the
/// node: [`node_trouble`]). An ASK leaves the map as it is: the slot is
/// only moving.
fn next_step(result: &Result<Answers>, redirects_left: usize) -> (Next<'_>, bool) {
    match result {
        Err(Error::Redirected { to, asking, .. }) => {
            let next = match redirects_left {
                0 => Next::Give,
                _ => Next::Redirect {
                    to,
                    asking: *asking,
                },
            };
            (next, !asking)
        }
        _ => (Next::Give, node_trouble(result)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::Answer;

    impl NodeRef for &'static str {
        fn same(&self, other: &Self) -> bool {
            self == other
        }
    }

    fn moved(to: &str) -> Result<Answers> {
        Err(Error::Redirected {
            slot: "3999".into(),
            to: to.into(),
            asking: false,
        })
    }

    fn ask(to: &str) -> Result<Answers> {
        Err(Error::Redirected {
            slot: "12".into(),
            to: to.into(),
            asking: true,
        })
    }

    fn count(n: i64) -> Result<Answers> {
        Ok((Answer::new(&[n]), Vec::new()))
    }

    fn node(to: &str) -> Result<&'static str> {
        match to {
            "a:1" => Ok("a"),
            "b:1" => Ok("b"),
            _ => Err(Error::Redis("a redirection named no node".into())),
        }
    }

    #[test]
    fn moved_and_ask_are_followed_while_redirections_are_left_and_moved_asks_for_the_map() {
        let to = |to, asking| Next::Redirect { to, asking };
        let (m, a) = (moved("127.0.0.1:7001"), ask("127.0.0.1:7002"));
        assert_eq!(
            next_step(&m, MAX_REDIRECTS),
            (to("127.0.0.1:7001", false), true)
        );
        assert_eq!(next_step(&a, 1), (to("127.0.0.1:7002", true), false));
        // Past its redirections a hit is given its MOVED or ASK; a MOVED still asks for the map.
        assert_eq!(next_step(&m, 0), (Next::Give, true));
        assert_eq!(next_step(&a, 0), (Next::Give, false));
        let down = Err(Error::Redis("CLUSTERDOWN The cluster is down".into()));
        assert_eq!(next_step(&down, 3), (Next::Give, true));
        assert_eq!(next_step(&count(1), 3), (Next::Give, false));
        assert_eq!(
            next_step(&Err(Error::CountOutOfRange), 3),
            (Next::Give, false)
        );
    }

    #[test]
    fn trouble_with_a_node_is_its_failure_or_a_slot_it_no_longer_holds() {
        let error = |e: Error| node_trouble(&Err(e));
        assert!(error(Error::Redis(
            "CLUSTERDOWN The cluster is down".into()
        )));
        assert!(error(Error::Redis("READONLY You can't write".into())));
        assert!(!error(Error::Redis(
            "ERR CLUSTERDOWN named in a message".into()
        )));
        assert!(!error(Error::CountOutOfRange));
        assert!(error(Error::Timeout { ms: 1, sent: true }));
        assert!(!node_trouble(&count(1)));
    }

    #[test]
    fn one_part_per_node_and_ask_and_the_results_in_the_calls_order() {
        let mut r = Routing::new([Some("a"), Some("b"), Some("a"), None]);
        assert!(r.take_stale(), "a slot no node serves asks for the map");
        let parts = r.parts();
        let shape: Vec<_> = parts
            .iter()
            .map(|p| (p.node, p.asking, &p.hits[..]))
            .collect();
        assert_eq!(shape, [("a", false, &[0, 2][..]), ("b", false, &[1][..])]);
        // b's hit moved to a; a's second hit is asked of b.
        r.answered(&parts[1], [moved("a:1")], node);
        r.answered(&parts[0], [count(1), ask("b:1")], node);
        assert!(r.take_stale(), "a MOVED asks for the map");
        assert_eq!(r.take_redirections(), 2);
        let again = r.parts();
        let shape: Vec<_> = again
            .iter()
            .map(|p| (p.node, p.asking, &p.hits[..]))
            .collect();
        assert_eq!(shape, [("a", false, &[1][..]), ("b", true, &[2][..])]);
        r.answered(&again[0], [count(2)], node);
        r.answered(&again[1], [count(3)], node);
        assert!(!r.take_stale(), "an ASK leaves the map as it is");
        assert!(r.parts().is_empty());
        let results = r.finish();
        let counts: Vec<_> = results[..3]
            .iter()
            .map(|r| r.as_ref().unwrap().0.values[0])
            .collect();
        assert_eq!(counts, [1, 2, 3]);
        assert_eq!(results[3].as_ref().unwrap_err().code(), "ERR_REDIS");
    }

    #[test]
    fn a_hit_redirected_past_its_redirections_is_given_its_moved_and_an_unknown_node_fails_it() {
        let mut r = Routing::new([Some("a"), Some("a")]);
        let first = r.parts();
        r.answered(&first[0], [moved("b:1"), moved("nowhere:1")], node);
        let error = |r: &Result<Answers>| r.as_ref().unwrap_err().to_string();
        for round in 1..=MAX_REDIRECTS {
            let parts = r.parts();
            assert_eq!(parts.len(), 1, "round {round}");
            let to = ["a:1", "b:1"][round % 2];
            r.answered(&parts[0], [moved(to)], node);
        }
        assert!(r.parts().is_empty(), "no redirection is left");
        let results = r.finish();
        assert!(
            error(&results[0]).contains("MOVED"),
            "{}",
            error(&results[0])
        );
        assert!(
            error(&results[1]).contains("no node"),
            "{}",
            error(&results[1])
        );
    }
}
