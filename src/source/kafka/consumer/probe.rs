//! The start-up probe of the Kafka side: before anything is consumed, a short-lived client with
//! the processor's own settings asks the brokers what the group member will need (each topic's
//! metadata, the group's committed offsets of its partitions, a fetch at a partition's end) and
//! turns what goes wrong into one line: credentials refused, a TLS handshake that fails, a topic
//! or group the principal may not use, or no broker answering within the start-up timeout.
//!
//! Invariant: the probe joins no group and commits nothing (`enable.auto.commit=false`, no
//! subscription), so it cannot move an offset; its one fetch (whether the principal may READ
//! the topic, which its metadata does not tell) starts at a partition's end and applies nothing. librdkafka retries
//! refused credentials and failed handshakes forever and reports them only as events: the probe
//! serves those events and stops at the first one that retrying cannot fix. Its lines never hold
//! a sensitive property's value (they are scrubbed of every one, [`crate::secret`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::startup_error::KafkaStartupError;
use super::KafkaSettings;
use crate::error::KafkaClientError;
use crate::secret::{scrub, sensitive_values};

/// The longest a single broker request of the probe waits before the events are served again.
const SLICE: Duration = Duration::from_millis(500);

/// What librdkafka said while the probe ran: its last failure line (a connection refused, a
/// handshake, an authentication), which its error events do not carry.
#[derive(Default)]
struct ProbeContext {
    last_failure: Mutex<Option<String>>,
}

impl ClientContext for ProbeContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let failure = matches!(
            level,
            RDKafkaLogLevel::Emerg
                | RDKafkaLogLevel::Alert
                | RDKafkaLogLevel::Critical
                | RDKafkaLogLevel::Error
        );
        if failure || fac == "FAIL" {
            let mut last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
            *last = Some(message.to_owned());
        }
    }

    fn error(&self, _error: KafkaError, _reason: &str) {
        // Served through the consumer's poll (`Probe::events`).
    }
}

impl ConsumerContext for ProbeContext {}

/// A problem the probe saw, before it is made a line.
enum Seen {
    /// The credentials were refused.
    Authentication,
    /// The TLS handshake failed.
    Tls,
    /// The group coordinator refused the group (no ACL for it).
    Group,
    /// A broker refused the topic.
    Topic,
}

struct Probe<'a> {
    settings: &'a KafkaSettings,
    /// The topic being probed (each of the settings' in turn).
    topic: String,
    consumer: BaseConsumer<ProbeContext>,
    deadline: Instant,
    timeout: Duration,
}

impl Probe<'_> {
    /// librdkafka's last failure line, without its `proto://host:port/id: ` prefix and scrubbed
    /// of every sensitive value.
    fn detail(&self) -> Option<String> {
        let last = self.consumer.context().last_failure.lock();
        let last = last.unwrap_or_else(|p| p.into_inner()).clone()?;
        let text = match last.split_once("/bootstrap: ") {
            Some((_, rest)) => rest.to_owned(),
            None => match last.find("]: ") {
                Some(at) => last[at + 3..].to_owned(),
                None => last,
            },
        };
        let text = text
            .split(" (after ")
            .next()
            .unwrap_or(&text)
            .trim()
            .to_owned();
        Some(scrub(&text, sensitive_values(&self.settings.overrides)))
    }

    /// Serves the client's pending events; the first that retrying cannot fix.
    fn events(&self) -> Option<Seen> {
        while let Some(event) = self.consumer.poll(Duration::ZERO) {
            if let Some(seen) = event.err().as_ref().and_then(code).and_then(fatal) {
                return Some(seen);
            }
        }
        None
    }

    fn failure(&self, seen: Seen) -> KafkaStartupError {
        let brokers = self.settings.brokers.clone();
        let detail = self.detail().unwrap_or_default();
        match seen {
            Seen::Authentication => KafkaStartupError::Authentication { brokers, detail },
            Seen::Tls => KafkaStartupError::Tls { brokers, detail },
            Seen::Group => self.group_refused(),
            Seen::Topic => self.topic_refused(),
        }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Runs one broker request in slices until it answers, serving the events between two
    /// slices; fails at the first event retrying cannot fix, or when the time is up.
    fn ask<T>(
        &self,
        mut request: impl FnMut(Duration) -> Result<T, KafkaError>,
    ) -> Result<T, KafkaStartupError> {
        loop {
            let slice = SLICE.min(self.remaining()).max(Duration::from_millis(1));
            let answer = request(slice);
            if let Some(seen) = self.events() {
                return Err(self.failure(seen));
            }
            match answer {
                Ok(v) => return Ok(v),
                Err(e) if is_timeout(&e) && !self.remaining().is_zero() => {}
                Err(e) if is_timeout(&e) => {
                    return Err(KafkaStartupError::Unreachable {
                        brokers: self.settings.brokers.clone(),
                        waited: self.timeout,
                        detail: self.detail().unwrap_or_else(|| "no answer".to_owned()),
                    })
                }
                Err(e) => return Err(self.refused(e)),
            }
        }
    }

    /// A request the brokers answered with an error.
    fn refused(&self, e: KafkaError) -> KafkaStartupError {
        match e.rdkafka_error_code() {
            Some(RDKafkaErrorCode::GroupAuthorizationFailed) => self.group_refused(),
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => self.topic_refused(),
            _ => KafkaStartupError::Request {
                brokers: self.settings.brokers.clone(),
                detail: scrub(&e.to_string(), sensitive_values(&self.settings.overrides)),
            },
        }
    }

    fn topic_refused(&self) -> KafkaStartupError {
        KafkaStartupError::TopicAuthorization {
            topic: self.topic.clone(),
        }
    }

    fn group_refused(&self) -> KafkaStartupError {
        KafkaStartupError::GroupAuthorization {
            group: self.settings.group.clone(),
        }
    }

    /// The topic's partitions (none when the topic does not exist yet: the member waits for it).
    fn partitions(&self) -> Result<Vec<i32>, KafkaStartupError> {
        let topic = self.topic.as_str();
        let metadata = self.ask(|t| self.consumer.fetch_metadata(Some(topic), t))?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(Vec::new());
        };
        match found.error() {
            None => Ok(found.partitions().iter().map(|p| p.id()).collect()),
            Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED) => {
                Err(self.topic_refused())
            }
            Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
                tracing::info!(
                    topic,
                    "the topic does not exist yet; the group member waits for it"
                );
                Ok(Vec::new())
            }
            Some(e) => Err(self.refused(KafkaError::MetadataFetch(e.into()))),
        }
    }

    /// The group's committed offsets of `partitions` (the group coordinator's OffsetFetch).
    fn committed(&self, partitions: &[i32]) -> Result<(), KafkaStartupError> {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition(&self.topic, *p);
        }
        let committed = self.ask(|t| self.consumer.committed_offsets(tpl.clone(), t))?;
        for elem in committed.elements() {
            if let Err(e) = elem.error() {
                return Err(self.refused(e));
            }
        }
        Ok(())
    }

    /// Whether the principal may read the topic (READ, which DESCRIBE does not give): `partition`
    /// assigned outside the group at its end, until a fetch there answers (an end-of-partition
    /// event) or is refused. Nothing is read from before the end, and nothing is applied.
    fn readable(&self, partition: i32) -> Result<(), KafkaStartupError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.topic, partition, Offset::End)
            .and_then(|()| self.consumer.assign(&tpl))
            .map_err(|e| self.refused(e))?;
        loop {
            let slice = SLICE.min(self.remaining());
            match self.consumer.poll(slice) {
                // The fetch answered: at the end, or with a record appended meanwhile (dropped).
                Some(Ok(_)) | Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => match code(&e) {
                    Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                        return Err(self.topic_refused())
                    }
                    Some(c) if fatal(c).is_some() => {
                        return Err(self.failure(fatal(c).expect("just matched")))
                    }
                    _ => {}
                },
                None if self.remaining().is_zero() => {
                    return Err(KafkaStartupError::Unreachable {
                        brokers: self.settings.brokers.clone(),
                        waited: self.timeout,
                        detail: self
                            .detail()
                            .unwrap_or_else(|| "no answer to a fetch".to_owned()),
                    })
                }
                None => {}
            }
        }
        let _ = self.consumer.unassign();
        Ok(())
    }
}

/// The error code of a client event.
fn code(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    match e {
        KafkaError::MessageConsumption(c)
        | KafkaError::MessageConsumptionFatal(c)
        | KafkaError::Global(c) => Some(*c),
        _ => None,
    }
}

/// What an event's code says that retrying cannot fix.
fn fatal(code: RDKafkaErrorCode) -> Option<Seen> {
    match code {
        RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => {
            Some(Seen::Authentication)
        }
        RDKafkaErrorCode::SSL => Some(Seen::Tls),
        RDKafkaErrorCode::GroupAuthorizationFailed => Some(Seen::Group),
        RDKafkaErrorCode::TopicAuthorizationFailed => Some(Seen::Topic),
        _ => None,
    }
}

fn is_timeout(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::OperationTimedOut
                | RDKafkaErrorCode::RequestTimedOut
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::Resolve
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::WaitingForCoordinator
        )
    )
}

/// The probe, blocking (run it off the async threads).
pub(crate) fn probe(settings: &KafkaSettings, timeout: Duration) -> Result<(), KafkaStartupError> {
    let mut config = settings.client_config();
    config
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("statistics.interval.ms", "0");
    let consumer: BaseConsumer<ProbeContext> = config
        .create_with_context(ProbeContext::default())
        .map_err(|e| KafkaStartupError::Client(KafkaClientError::new(e, &settings.overrides)))?;
    let mut probe = Probe {
        settings,
        topic: String::new(),
        consumer,
        deadline: Instant::now() + timeout,
        timeout,
    };
    for topic in &settings.topics {
        probe.topic = topic.clone();
        let partitions = probe.partitions()?;
        if let Some(first) = partitions.first() {
            probe.committed(&partitions)?;
            probe.readable(*first)?;
        }
    }
    Ok(())
}
