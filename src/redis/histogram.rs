//! A log-linear (HDR-style) histogram of durations in microseconds: each
//! power of two is split into 16 equal buckets, so a quantile read from it
//! is within 1/16 (6.25%) of the true value, from 1 µs up to 2^40 µs
//! (12 days), in a fixed 5 KiB and one add per value recorded.

/// Linear buckets per power of two, log 2.
const SUB_LOG2: u32 = 4;
const SUB: usize = 1 << SUB_LOG2;
/// Powers of two kept: values past 2^40 µs land in the last bucket.
const POWERS: usize = 40;
const BUCKETS: usize = (POWERS - SUB_LOG2 as usize + 1) * SUB;

#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    sum: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::new()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            sum: 0,
            max: 0,
        }
    }

    /// The bucket of `us`: values below 16 have one bucket each, then each
    /// power of two its 16.
    fn bucket(us: u64) -> usize {
        if us < SUB as u64 {
            return us as usize;
        }
        let power = 63 - us.leading_zeros();
        let sub = (us >> (power - SUB_LOG2)) as usize & (SUB - 1);
        ((power - SUB_LOG2 + 1) as usize * SUB + sub).min(BUCKETS - 1)
    }

    /// The highest value a bucket holds.
    fn bucket_top(b: usize) -> u64 {
        if b < SUB {
            return b as u64;
        }
        let power = (b / SUB) as u32 + SUB_LOG2 - 1;
        let sub = (b % SUB) as u64;
        ((SUB as u64 + sub + 1) << (power - SUB_LOG2)) - 1
    }

    pub fn record(&mut self, us: u64) {
        self.counts[Self::bucket(us)] += 1;
        self.total += 1;
        self.sum = self.sum.saturating_add(us);
        self.max = self.max.max(us);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum = self.sum.saturating_add(other.sum);
        self.max = self.max.max(other.max);
    }

    /// Forgets every value recorded.
    pub fn clear(&mut self) {
        self.counts.fill(0);
        (self.total, self.sum, self.max) = (0, 0, 0);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The sum of every value recorded.
    pub fn sum(&self) -> u64 {
        self.sum
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1): the top of the bucket the q-th
    /// value falls in, never above the largest value recorded; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (b, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::bucket_top(b).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut last = 0;
        for us in (0..100_000u64).chain([1 << 30, (1 << 40) - 1]) {
            let b = Histogram::bucket(us);
            assert!(b >= last, "{us}");
            assert!(Histogram::bucket_top(b) >= us, "{us} above its bucket");
            last = b;
        }
        assert_eq!(Histogram::bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_a_sixteenth() {
        let mut h = Histogram::new();
        for us in 1..=10_000 {
            h.record(us);
        }
        for (q, want) in [(0.5, 5_000.0), (0.9, 9_000.0), (0.99, 9_900.0)] {
            let got = h.quantile(q) as f64;
            assert!(
                got >= want && got <= want * (1.0 + 1.0 / 16.0),
                "{q}: {got}"
            );
        }
        assert_eq!(h.quantile(1.0), 10_000);
        assert_eq!((h.count(), h.max(), h.sum()), (10_000, 10_000, 50_005_000));
        let mut merged = Histogram::new();
        merged.merge(&h);
        merged.record(20_000);
        assert_eq!((merged.count(), merged.max()), (10_001, 20_000));
        assert_eq!(Histogram::new().quantile(0.5), 0);
    }
}
