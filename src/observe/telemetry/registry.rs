//! How the metrics are shown: one Prometheus registry of every series, with its help text, and
//! its OpenMetrics text.

use prometheus_client::registry::{Registry, Unit};

use super::{Telemetry, PREFIX};

impl Telemetry {
    /// A registry holding every metric, named with the `batch_inbox_` prefix.
    pub(crate) fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix(PREFIX);
        r.register(
            "messages_consumed",
            "Records in committed transactions: applied, skipped as duplicates, or dead-lettered",
            self.consumed.clone(),
        );
        r.register(
            "messages_new",
            "Records whose id was new to the inbox (handed to the handler)",
            self.new.clone(),
        );
        r.register(
            "duplicates_skipped",
            "Records skipped because their id was already in the inbox or earlier in the batch",
            self.duplicates.clone(),
        );
        r.register(
            "dead_letters",
            "Records dead-lettered, by reason (bad input or refused by the handler)",
            self.dead_letters.clone(),
        );
        r.register(
            "batches_committed",
            "Committed transactions: one per batch (one per record in per-message mode)",
            self.batches.clone(),
        );
        r.register(
            "retries",
            "Transaction attempts that failed transiently and were retried",
            self.retries.clone(),
        );
        r.register(
            "positions_rewound",
            "Times a partition started from, or went back to, a database position behind Kafka's \
             or this member's: the database went back in time (a restore, a failover)",
            self.positions_rewound.clone(),
        );
        r.register(
            "records_rewound",
            "Records between the database's position and Kafka's or this member's at those \
             rewinds: re-read, the inbox skipping what the database still holds",
            self.records_rewound.clone(),
        );
        r.register(
            "redeliveries",
            "Deliveries the broker marked as delivered before (RabbitMQ: an earlier delivery of \
             the message was not acknowledged: a channel closed, an instance died); the inbox \
             skips what committed",
            self.redeliveries.clone(),
        );
        self.register_histograms(&mut r);
        self.register_gauges(&mut r);
        self.stalls.register(&mut r);
        r
    }

    fn register_histograms(&self, r: &mut Registry) {
        r.register(
            "batch_messages",
            "Records per committed transaction",
            self.batch_size.clone(),
        );
        r.register_with_unit(
            "stage_duration",
            "Time per batch in each stage: batch_wait (first record to close), dedup, handler, \
             dead_letters, commit, offset_store",
            Unit::Seconds,
            self.stages.clone(),
        );
        r.register_with_unit(
            "end_to_end_latency",
            "Per record: Kafka timestamp to the COMMIT of its transaction",
            Unit::Seconds,
            self.end_to_end.clone(),
        );
        r.register_with_unit(
            "receive_latency",
            "Per record: Kafka timestamp to its arrival at its partition worker (producer, broker \
             and client)",
            Unit::Seconds,
            self.receive.clone(),
        );
        r.register_with_unit(
            "in_batch_wait",
            "Per record: arrival at its partition worker to the close of its batch",
            Unit::Seconds,
            self.in_batch.clone(),
        );
    }

    fn register_gauges(&self, r: &mut Registry) {
        r.register_with_unit(
            "consumer_lag",
            "Records of an assigned partition after the last offset committed to the database \
             (librdkafka statistics)",
            Unit::Other("messages".to_owned()),
            self.lag.clone(),
        );
        r.register(
            "batches_in_flight",
            "Transactions running now",
            self.in_flight.clone(),
        );
        r.register(
            "assigned_partitions",
            "Partitions assigned to this group member (one worker each)",
            self.assigned.clone(),
        );
        r.register(
            "pool_connections_in_use",
            "Database connections checked out of the pool",
            self.pool_in_use.clone(),
        );
        r.register(
            "pool_connections_max",
            "Largest number of database connections of the pool",
            self.pool_max.clone(),
        );
        r.register(
            "unsafe_mode",
            "1 while a test-only unsafe switch is on (--unsafe-offsets-before-commit, \
             --unsafe-no-inbox): the exactly-once guarantee does not hold",
            self.unsafe_mode.clone(),
        );
    }

    /// The metrics in the OpenMetrics text format.
    pub(crate) fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry());
        text
    }
}
