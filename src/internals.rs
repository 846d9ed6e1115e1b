//! **Not part of the API.** The one door through which the binary's command line, the tests, the
//! load tools (`batch-inbox-tools`) and the benches reach the crate's own parts: statements,
//! defaults, the pipeline's stages, the flags the binary shares with the load tools. Hidden from
//! the documentation; anything here may change or go in any release, a patch release too, and
//! `cargo semver-checks` does not check it. A service that embeds the library uses the crate
//! root's items and its public modules instead.
//!
//! The modules here are named after the parts they open; each re-exports what is used outside
//! the crate and the types that it names, nothing more (the statements and the defaults whole:
//! they are tables).

/// UUIDv7 time and the daily partitions' names.
pub mod days {
    pub use crate::days::{day_bounds, day_of_millis, partition_name, unix_millis};
}

/// Every statement the processor runs.
pub mod sql {
    pub use crate::db::sql::*;
}

/// Every default of the processor.
pub use crate::pipeline::defaults;

/// The flags the binary shares with the load tools, each converted into the library's types.
pub mod flags {
    pub use crate::flags::*;
}

/// What is never shown: the masks and redactions the command line uses.
pub mod secret {
    pub use crate::secret::{redact_database_url, redact_property_arg, LIBRDKAFKA_SENSITIVE, MASK};
}

/// How the RabbitMQ source declares a queue, for the tools that publish to one; its frame
/// guard, for the bench.
pub mod amqp {
    pub use crate::source::amqp::declare;
    pub use crate::source::amqp::guard_frames;
}

pub mod names {
    pub use crate::names::{parse_interval, Named};
}

/// The per-partition micro-batcher.
pub mod batcher {
    pub use crate::pipeline::batcher::{Batch, Batcher};
}

/// Records decoded into messages and dead letters.
pub mod message {
    pub use crate::pipeline::message::{
        decode_batch, dedup_in_batch, parse_id, DeadLetter, Decoded, MAX_ID_TEXT_BYTES,
    };
}

/// A dead letter's row, as the inbox writes it (the fuzz target checks every value is storable).
pub mod dead_letter {
    pub use crate::pipeline::dead_letter::{row, Row, RowForm, MAX_DETAIL_BYTES};
}

/// The latency measurements of the stats file (the fuzz target feeds them any timestamp).
pub mod metrics {
    pub use crate::observe::metrics::Metrics;
    pub use crate::observe::outcome::BatchSample;
}

/// The inbox transaction.
pub mod inbox {
    pub use crate::pipeline::inbox::{
        Inbox, ReasonCounts, StageTimings, TxOutcome, MAX_DETAIL_BYTES,
    };
}

/// The partition's worker, its source's interface and the breaker's parsers.
pub mod worker {
    pub use crate::pipeline::worker::{
        parse_max_poison_rate, parse_poison_limit, Input, MaxPoisonLimit, OffsetSink,
        PartitionWorker,
    };
}

/// The HTTP listener: metrics and probes.
pub mod exporter {
    pub use crate::observe::exporter::start;
}

/// The stats file's writer.
pub mod stats_file {
    pub use crate::observe::stats_file::{write_atomically, StatsFile};
}

/// Retention's parts: row deletes and daily partitions.
pub mod retention {
    /// Row deletes.
    pub mod delete {
        pub use crate::maintenance::retention::delete::NOT_V7;
    }
    /// Daily partitions.
    pub mod partition {
        pub use crate::maintenance::retention::partition::{
            create_day, layout, partition_days, DdlOutcome,
        };
    }
}
