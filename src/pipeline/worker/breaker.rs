//! The poison-rate breaker: what SQLSTATE classification cannot see. A deployment whose SQL is
//! wrong for every message can fail with a data-class error (a cast of a field it misnames),
//! which is the message's fault by its class; without a limit, the partition would dead-letter
//! the whole stream.
//!
//! It compares the share of messages that fail, not their count per unit of time: a count per
//! minute cannot tell bad data from a broken deployment (1% bad data at 100,000 messages/s is
//! 1,000 a second; a broken deployment on a topic with a message every 5 s is 12 a minute).
//!
//! Invariant: a partition dead-letters a poison message unless more than `percent` % of the
//! last `window` messages it tried (applied, or failed alone) failed, that message included,
//! and more than `min` of them failed (the floor: at least `min` dead letters before it can
//! trip). The one that trips it is not dead-lettered: the partition stalls on it (retried with
//! capped backoff) until a retry of it commits, which resets the breaker. Only the poison path
//! counts as a failure: undecodable records are not counted, and the handler's rejections are
//! outcomes of messages it applied.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The floor of `--max-poison-rate` (`min=N`): the breaker never trips before `count` poison
/// dead letters within its window of messages.
///
/// Before 0.3 the breaker counted dead letters per unit of time (`N/DURATION`); that form is
/// still accepted, as the floor `N`. `per` is kept for compatibility and no longer used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoisonRate {
    /// Dead letters before the breaker may trip (at least 1).
    pub count: u32,
    /// Unused since the breaker compares shares (the window is one of messages, [`PoisonShare`]).
    pub per: Duration,
}

impl PoisonRate {
    /// The default floor, 20 dead letters per partition: with the default share, a deployment
    /// that fails every message stalls on the 21st, whatever the rate of the topic.
    pub const DEFAULT: PoisonRate = PoisonRate {
        count: 20,
        per: Duration::from_secs(60),
    };

    /// The floor `count`.
    pub const fn floor(count: u32) -> PoisonRate {
        PoisonRate {
            count,
            per: Self::DEFAULT.per,
        }
    }
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

/// The share of `--max-poison-rate` (`50%/100`): the breaker trips when more than `percent` %
/// of the last `window` messages a partition tried failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoisonShare {
    /// The share of failed messages that trips the breaker when exceeded (0 to 99).
    pub percent: u8,
    /// How many of the partition's last messages count (at least 2).
    pub window: u32,
}

impl PoisonShare {
    /// The default, more than half of the last 100: bad data is a few percent of a stream at
    /// worst, a broken deployment fails (nearly) every message.
    pub const DEFAULT: PoisonShare = PoisonShare {
        percent: 50,
        window: 100,
    };

    /// More than `percent` % of the last `window` messages; `percent` below 100, `window` at
    /// least 2.
    pub fn new(percent: u8, window: u32) -> Result<Self, String> {
        if percent >= 100 {
            return Err(format!("{percent}%: the share must be below 100%"));
        }
        if window < 2 {
            return Err(format!(
                "{window}: the window must hold at least 2 messages"
            ));
        }
        Ok(Self { percent, window })
    }
}

/// The whole value of `--max-poison-rate` when on: the share and its floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoisonLimit {
    /// The share of the last messages that trips the breaker.
    pub share: PoisonShare,
    /// The floor (its `count`; `per` is unused).
    pub floor: PoisonRate,
}

impl PoisonLimit {
    /// The default, `50%/100,min=20`.
    pub const DEFAULT: PoisonLimit = PoisonLimit {
        share: PoisonShare::DEFAULT,
        floor: PoisonRate::DEFAULT,
    };

    /// `share` with the floor `min`; the floor must be below the window, or it could never trip.
    pub fn new(share: PoisonShare, min: u32) -> Result<Self, String> {
        if min == 0 {
            return Err("min=0: the floor must be at least 1 (off disables the breaker)".into());
        }
        if min >= share.window {
            return Err(format!(
                "min={min}: the floor must be below the window ({})",
                share.window
            ));
        }
        Ok(Self {
            share,
            floor: PoisonRate::floor(min),
        })
    }
}

impl fmt::Display for PoisonLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let PoisonShare { percent, window } = self.share;
        write!(f, "{percent}%/{window},min={}", self.floor.count)
    }
}

/// Parses `--max-poison-rate`: `P%/W` (more than P % of the last W messages), optionally
/// `,min=N` (the floor; 20 when not given), or `off`. The form of before 0.3, `N/DURATION`
/// (`20/1m`), is the floor `N` with the default share (its window widened to 2·N when N is 100
/// or more).
pub fn parse_poison_limit(s: &str) -> Result<Option<PoisonLimit>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let usage =
        || format!("expected P%/W[,min=N] (like 50%/100,min=20), N/DURATION or off, got {s:?}");
    let (share, min) = match s.split_once(',') {
        Some((share, min)) => {
            let n = min.trim().strip_prefix("min=").ok_or_else(usage)?;
            (
                share.trim(),
                Some(n.trim().parse::<u32>().map_err(|_| usage())?),
            )
        }
        None => (s, None),
    };
    let (left, right) = share.split_once('/').ok_or_else(usage)?;
    let Some(percent) = left.trim().strip_suffix('%') else {
        if min.is_some() {
            return Err(usage());
        }
        return parse_legacy(s, left, right).map(Some);
    };
    let percent: u8 = percent.trim().parse().map_err(|_| usage())?;
    let window: u32 = right.trim().parse().map_err(|_| usage())?;
    let share = PoisonShare::new(percent, window).map_err(|e| format!("{s:?}: {e}"))?;
    let min = min.unwrap_or(PoisonRate::DEFAULT.count);
    PoisonLimit::new(share, min)
        .map(Some)
        .map_err(|e| format!("{s:?}: {e}"))
}

/// `N/DURATION`, the form of before 0.3: the floor `N`, the default share.
fn parse_legacy(s: &str, count: &str, per: &str) -> Result<PoisonLimit, String> {
    let usage =
        || format!("expected P%/W[,min=N] (like 50%/100,min=20), N/DURATION or off, got {s:?}");
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
    let window = PoisonShare::DEFAULT.window.max(count.saturating_mul(2));
    let share = PoisonShare {
        window,
        ..PoisonShare::DEFAULT
    };
    Ok(PoisonLimit {
        share,
        floor: PoisonRate { count, per },
    })
}

/// Parses `--max-poison-rate` ([`parse_poison_limit`]) and returns its floor only.
pub fn parse_max_poison_rate(s: &str) -> Result<Option<PoisonRate>, String> {
    parse_poison_limit(s).map(|limit| limit.map(|l| l.floor))
}

impl FromStr for PoisonRate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_max_poison_rate(s)?.ok_or_else(|| "off is not a rate".to_owned())
    }
}

/// The value of `--max-poison-rate`: the breaker's limit, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPoisonLimit(pub Option<PoisonLimit>);

impl FromStr for MaxPoisonLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_poison_limit(s).map(MaxPoisonLimit)
    }
}

impl fmt::Display for MaxPoisonLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(limit) => limit.fmt(f),
            None => f.write_str("off"),
        }
    }
}

impl super::WorkerSettings {
    /// Sets the poison-rate breaker from a [`PoisonLimit`] (`None`: off).
    pub fn set_poison_limit(&mut self, limit: Option<PoisonLimit>) {
        self.max_poison_rate = limit.map(|l| l.floor);
        self.poison_share = limit.map_or(PoisonShare::DEFAULT, |l| l.share);
    }
}

/// One partition's breaker: whether each of its last messages failed.
#[derive(Debug, Default)]
pub(super) struct Breaker {
    limit: Option<PoisonLimit>,
    /// The last at most `window` messages, oldest first: true when it failed.
    recent: VecDeque<bool>,
    /// How many of `recent` failed.
    failed: u32,
}

impl Breaker {
    pub(super) fn new(floor: Option<PoisonRate>, share: PoisonShare) -> Self {
        Self {
            limit: floor.map(|floor| PoisonLimit { share, floor }),
            recent: VecDeque::new(),
            failed: 0,
        }
    }

    fn window(&self) -> usize {
        self.limit.map_or(0, |l| l.share.window as usize)
    }

    fn push(&mut self, failed: bool) {
        if self.recent.len() >= self.window() && self.recent.pop_front() == Some(true) {
            self.failed -= 1;
        }
        self.recent.push_back(failed);
        self.failed += u32::from(failed);
    }

    /// `n` messages were applied (committed, rejected by the handler included).
    pub(super) fn applied(&mut self, n: usize) {
        if self.limit.is_none() {
            return;
        }
        for _ in 0..n.min(self.window()) {
            self.push(false);
        }
    }

    /// One more message failed alone: whether it trips the breaker (more than the share of the
    /// window failed, and more than the floor). It is counted either way.
    pub(super) fn trips(&mut self) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        self.push(true);
        let (failed, tried) = (u64::from(self.failed), self.recent.len() as u64);
        failed > u64::from(limit.floor.count)
            && failed * 100 > u64::from(limit.share.percent) * tried
    }

    /// The failing message committed at last: its cause was fixed.
    pub(super) fn reset(&mut self) {
        self.recent.clear();
        self.failed = 0;
    }

    /// The limit, for logs.
    pub(super) fn limit(&self) -> Option<PoisonLimit> {
        self.limit
    }
}

#[cfg(test)]
mod tests;
