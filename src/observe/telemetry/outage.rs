//! A broker outage said in a few lines instead of a flood: librdkafka reports a connection
//! failure for every connection it retries (`AllBrokersDown`, `BrokerTransportFailure`, from
//! the client and from each partition's queue), which made a 16 s outage 138 WARN lines.
//!
//! Invariant: an outage is logged once when its first error arrives, then at most once per
//! `every` while errors keep arriving (how long, how many errors, the last one), and once when
//! it is over. It is over when Kafka answers (a broker is up in librdkafka's statistics, or an
//! offset commit is accepted) and no connection error arrived within `settle`: a broker that
//! stays down while the others answer is one outage, not one per reconnect attempt.
//! [`Outage`] is pure (its clock is passed in); [`OutageLog`] logs its lines.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// A line of the outage's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    /// The outage began with this error.
    Began(String),
    /// It still lasts: for this long, with this many errors so far, the last one.
    Lasts {
        lasted: Duration,
        errors: u64,
        last: String,
    },
    /// It is over: errors came for this long, this many, the last one `quiet` ago.
    Over {
        lasted: Duration,
        errors: u64,
        quiet: Duration,
    },
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Line::Began(e) => write!(
                f,
                "Kafka unreachable: {e} (further connection errors are counted, not logged, \
                 until it answers again)"
            ),
            Line::Lasts {
                lasted,
                errors,
                last,
            } => write!(
                f,
                "Kafka unreachable for {} s, {errors} errors (last: {last})",
                lasted.as_secs()
            ),
            Line::Over {
                lasted,
                errors,
                quiet,
            } => write!(
                f,
                "Kafka answers again: unreachable for {} s, {errors} errors, the last {} s ago",
                lasted.as_secs(),
                quiet.as_secs()
            ),
        }
    }
}

/// An outage under way.
#[derive(Debug)]
struct Down {
    since: Instant,
    errors: u64,
    last_error: Instant,
    last_line: Instant,
}

/// Whether Kafka is unreachable, and what to log about it.
#[derive(Debug)]
pub(crate) struct Outage {
    every: Duration,
    settle: Duration,
    down: Option<Down>,
}

impl Outage {
    /// A line at most every 30 s while it lasts.
    pub(crate) const EVERY: Duration = Duration::from_secs(30);
    /// Over only once no error came for 15 s: librdkafka retries a broker that is down at
    /// least every 10 s (`reconnect.backoff.max.ms`).
    pub(crate) const SETTLE: Duration = Duration::from_secs(15);

    pub(crate) fn new(every: Duration, settle: Duration) -> Self {
        Self {
            every,
            settle,
            down: None,
        }
    }

    /// A connection error at `now`: the line to log, if any.
    pub(crate) fn error(&mut self, now: Instant, what: &str) -> Option<Line> {
        let Some(down) = self.down.as_mut() else {
            self.down = Some(Down {
                since: now,
                errors: 1,
                last_error: now,
                last_line: now,
            });
            return Some(Line::Began(what.to_owned()));
        };
        down.errors += 1;
        down.last_error = now;
        if now.saturating_duration_since(down.last_line) < self.every {
            return None;
        }
        down.last_line = now;
        Some(Line::Lasts {
            lasted: now.saturating_duration_since(down.since),
            errors: down.errors,
            last: what.to_owned(),
        })
    }

    /// Kafka answered at `now`: the line to log, if that ends an outage.
    pub(crate) fn answered(&mut self, now: Instant) -> Option<Line> {
        let down = self.down.as_ref()?;
        if now.saturating_duration_since(down.last_error) < self.settle {
            return None;
        }
        let line = Line::Over {
            lasted: down.last_error.saturating_duration_since(down.since),
            errors: down.errors,
            quiet: now.saturating_duration_since(down.last_error),
        };
        self.down = None;
        Some(line)
    }
}

impl Default for Outage {
    fn default() -> Self {
        Self::new(Self::EVERY, Self::SETTLE)
    }
}

/// True for the errors of an unreachable Kafka (counted by the outage, not logged each).
pub(crate) fn is_connection_error(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::Resolve
        )
    )
}

/// The member's outage, shared by the client's callbacks and the partitions' queues; logs its
/// lines at WARN (and the end at INFO).
#[derive(Debug, Default)]
pub(crate) struct OutageLog(Mutex<Outage>);

impl OutageLog {
    fn with<T>(&self, f: impl FnOnce(&mut Outage) -> T) -> T {
        // The state is a few numbers, consistent after any panic: recover it.
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A connection error (see [`is_connection_error`]).
    pub(crate) fn error(&self, e: &KafkaError) {
        let what = e.to_string();
        if let Some(line) = self.with(|o| o.error(Instant::now(), &what)) {
            tracing::warn!("{line}");
        }
    }

    /// Kafka answered.
    pub(crate) fn answered(&self) {
        if let Some(line) = self.with(|o| o.answered(Instant::now())) {
            tracing::info!("{line}");
        }
    }

    /// Kafka answered when librdkafka's statistics show a broker up.
    pub(crate) fn statistics(&self, statistics: &rdkafka::Statistics) {
        if statistics.brokers.values().any(|b| b.state == "UP") {
            self.answered();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY: Duration = Duration::from_secs(30);
    const SETTLE: Duration = Duration::from_secs(15);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn an_outage_is_said_once_then_every_30_s_then_once_when_over() {
        let mut o = Outage::new(EVERY, SETTLE);
        let t0 = Instant::now();
        assert_eq!(o.answered(t0), None, "no outage");
        assert_eq!(
            o.error(t0, "all brokers down"),
            Some(Line::Began("all brokers down".into()))
        );
        // Eight errors a second for 45 s: one more line, at 30 s.
        let mut lines = Vec::new();
        for ms in (125..45_000).step_by(125) {
            lines.extend(o.error(at(t0, ms), "transport failure"));
            assert_eq!(o.answered(at(t0, ms)), None, "errors keep coming");
        }
        assert_eq!(
            lines,
            [Line::Lasts {
                lasted: Duration::from_secs(30),
                errors: 241,
                last: "transport failure".into()
            }]
        );
        assert_eq!(o.answered(at(t0, 50_000)), None, "an error 5 s ago");
        let over = o.answered(at(t0, 60_000)).expect("over");
        assert_eq!(
            over,
            Line::Over {
                lasted: Duration::from_millis(44_875),
                errors: 360,
                quiet: Duration::from_millis(15_125),
            }
        );
        assert_eq!(
            over.to_string(),
            "Kafka answers again: unreachable for 44 s, 360 errors, the last 15 s ago"
        );
        assert_eq!(o.answered(at(t0, 61_000)), None, "said once");
        assert!(matches!(o.error(at(t0, 70_000), "x"), Some(Line::Began(_))));
    }

    #[test]
    fn a_long_outage_says_a_line_every_30_s_with_the_count_and_duration() {
        let mut o = Outage::new(EVERY, SETTLE);
        let t0 = Instant::now();
        let lines: Vec<String> = (0..=120)
            .filter_map(|s| o.error(at(t0, s * 1_000), "all brokers down"))
            .map(|l| l.to_string())
            .collect();
        assert_eq!(lines.len(), 5, "{lines:?}");
        assert!(lines[0].starts_with("Kafka unreachable: all brokers down"));
        assert_eq!(
            lines[2],
            "Kafka unreachable for 60 s, 61 errors (last: all brokers down)"
        );
    }

    #[test]
    fn a_broker_that_stays_down_while_others_answer_is_one_outage() {
        let mut o = Outage::new(EVERY, SETTLE);
        let t0 = Instant::now();
        let mut lines = 0;
        // A reconnect error every 10 s, answers every second, for 5 minutes.
        for s in 0..300 {
            if s % 10 == 0 {
                lines += usize::from(o.error(at(t0, s * 1_000), "broker 3 down").is_some());
            }
            lines += usize::from(o.answered(at(t0, s * 1_000 + 500)).is_some());
        }
        assert_eq!(lines, 10, "the first line, then one every 30 s");
    }

    #[test]
    fn only_connection_errors_are_an_outage() {
        let down = KafkaError::Global(RDKafkaErrorCode::AllBrokersDown);
        let transport = KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure);
        let denied = KafkaError::MessageConsumption(RDKafkaErrorCode::TopicAuthorizationFailed);
        assert!(is_connection_error(&down) && is_connection_error(&transport));
        assert!(!is_connection_error(&denied));
    }
}
