//! The poison-rate breaker: what SQLSTATE classification cannot see. A deployment whose SQL is
//! wrong for every message can fail with a data-class error (a cast of a field it misnames),
//! which is the message's fault by its class; without a limit, the partition would dead-letter
//! the whole stream.
//!
//! Invariant: a partition dead-letters at most `count` poison messages within any window of
//! `per`; the one that would exceed it is not dead-lettered, and the partition stalls on it
//! (retried with capped backoff) until a retry of it commits, which resets the breaker. Only
//! the poison path counts: undecodable records and the handler's rejections are outcomes, not
//! failures.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// `--max-poison-rate`: at most `count` poison dead letters per partition within `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoisonRate {
    /// Dead letters allowed within the window (at least 1).
    pub count: u32,
    /// The window.
    pub per: Duration,
}

impl PoisonRate {
    /// The default, 20 per minute and partition: one poison message every three seconds for a
    /// whole minute is a broken deployment far more often than bad data, and stalling costs
    /// nothing that a fix does not give back, while each dead letter needs a re-drive.
    pub const DEFAULT: PoisonRate = PoisonRate {
        count: 20,
        per: Duration::from_secs(60),
    };
}

impl fmt::Display for PoisonRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.per.as_millis();
        match ms {
            ms if ms % 60_000 == 0 => write!(f, "{}/{}m", self.count, ms / 60_000),
            ms if ms % 1_000 == 0 => write!(f, "{}/{}s", self.count, ms / 1_000),
            ms => write!(f, "{}/{ms}ms", self.count),
        }
    }
}

/// Parses `N/DURATION` (`20/1m`, `5/10s`) or `off`.
pub fn parse_max_poison_rate(s: &str) -> Result<Option<PoisonRate>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let usage = || format!("expected N/DURATION (like 20/1m) or off, got {s:?}");
    let (count, per) = s.split_once('/').ok_or_else(usage)?;
    let count: u32 = count.trim().parse().map_err(|_| usage())?;
    if count == 0 {
        return Err(format!(
            "{s:?}: the count must be at least 1 (off disables the breaker)"
        ));
    }
    let per = crate::names::parse_interval(per)?;
    if per.is_zero() {
        return Err(format!("{s:?}: the duration must be longer than zero"));
    }
    Ok(Some(PoisonRate { count, per }))
}

/// The value of `--max-poison-rate`: a rate, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPoisonRate(pub Option<PoisonRate>);

impl FromStr for MaxPoisonRate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_max_poison_rate(s).map(MaxPoisonRate)
    }
}

impl fmt::Display for MaxPoisonRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(rate) => rate.fmt(f),
            None => f.write_str("off"),
        }
    }
}

impl FromStr for PoisonRate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_max_poison_rate(s)?.ok_or_else(|| "off is not a rate".to_owned())
    }
}

/// One partition's breaker: when its recent poison dead letters were written.
#[derive(Debug, Default)]
pub(super) struct Breaker {
    limit: Option<PoisonRate>,
    recent: VecDeque<Instant>,
}

impl Breaker {
    pub(super) fn new(limit: Option<PoisonRate>) -> Self {
        Self {
            limit,
            recent: VecDeque::new(),
        }
    }

    /// Whether one more poison dead letter at `now` would exceed the limit. When it would not,
    /// it is counted.
    pub(super) fn trips(&mut self, now: Instant) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= limit.per)
        {
            self.recent.pop_front();
        }
        if self.recent.len() >= limit.count as usize {
            return true;
        }
        self.recent.push_back(now);
        false
    }

    /// The failing message committed at last: its cause was fixed.
    pub(super) fn reset(&mut self) {
        self.recent.clear();
    }

    /// The limit, for logs.
    pub(super) fn limit(&self) -> Option<PoisonRate> {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print() {
        assert_eq!(
            parse_max_poison_rate("20/1m"),
            Ok(Some(PoisonRate::DEFAULT))
        );
        assert_eq!(parse_max_poison_rate("off"), Ok(None));
        let r = parse_max_poison_rate("5/10s").unwrap().unwrap();
        assert_eq!((r.count, r.per), (5, Duration::from_secs(10)));
        assert_eq!(r.to_string(), "5/10s");
        assert_eq!(PoisonRate::DEFAULT.to_string(), "20/1m");
        for bad in ["", "20", "0/1m", "x/1m", "20/0s", "20/1y", "-1/1m"] {
            assert!(parse_max_poison_rate(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_breaker_trips_on_the_one_that_would_exceed_the_window_and_resets_on_success() {
        let limit = PoisonRate {
            count: 3,
            per: Duration::from_secs(10),
        };
        let mut b = Breaker::new(Some(limit));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!b.trips(at(0)));
        assert!(!b.trips(at(1)));
        assert!(!b.trips(at(2)));
        assert!(b.trips(at(3)), "a fourth within 10 s");
        assert!(b.trips(at(9)), "still within the window of the first");
        assert!(!b.trips(at(10)), "the first left the window");
        assert!(b.trips(at(10)));
        b.reset();
        assert!(!b.trips(at(11)));
    }

    #[test]
    fn off_never_trips() {
        let mut b = Breaker::new(None);
        let now = Instant::now();
        assert!((0..10_000).all(|_| !b.trips(now)));
    }
}
