//! librdkafka settings that would silently break the processor's guarantee, refused before
//! anything is consumed.
//!
//! Invariant: every client property the processor's invariants depend on is a [`Rule`] of
//! [`RULES`], with the values it may take and the reason for refusing the others; [`check`] runs
//! over the final client configuration (the processor's defaults, then every `-X` override) before
//! a consumer is created, so no unsafe combination reaches librdkafka.
//!
//! Properties not listed are passed through: tuning (fetch sizes, timeouts), security (SASL,
//! TLS) and the assignment strategy (both eager and cooperative rebalances are handled) cannot
//! lose or repeat an effect.

use super::KafkaSettings;
pub(crate) use crate::error::RefusedSetting;

/// What a rule may weigh besides the property's value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    /// `--group`: the key of the offsets stored in the database.
    pub group: &'a str,
    /// Whether end-of-partition events are asked for (`--exit-on-eof`).
    pub partition_eof: bool,
    /// `--offsets-in-db`: each batch's transaction stores the next offset, and an assignment
    /// starts there.
    pub offsets_in_db: bool,
}

/// A property the guarantee depends on.
pub(crate) struct Rule {
    /// The librdkafka property.
    pub key: &'static str,
    /// The safe values, in words.
    pub safe: &'static str,
    /// Whether a value is safe in a context.
    pub allowed: fn(&str, &Context<'_>) -> bool,
    /// Why the other values are refused.
    pub reason: &'static str,
}

/// Every property the guarantee depends on, with its reason.
pub(crate) const RULES: &[Rule] = &[
    Rule {
        key: "enable.auto.offset.store",
        safe: "false",
        allowed: |v, _| parse_bool(v) == Some(false),
        reason: "librdkafka would store each offset when its record is handed over, before the \
                 database COMMIT: a crash would lose records",
    },
    Rule {
        key: "enable.auto.commit",
        safe: "true, unless --offsets-in-db is on",
        allowed: |v, c| c.offsets_in_db || parse_bool(v) == Some(true),
        reason: "with --offsets-in-db=false, offsets would reach Kafka only at a revoke or a \
                 shutdown, so a crash would read the whole run again, and copies older than the \
                 inbox retention would be applied again; keep it, or keep --offsets-in-db on \
                 (the database's offsets then decide where a partition starts)",
    },
    Rule {
        key: "group.id",
        safe: "the --group value",
        allowed: |v, c| v == c.group,
        reason: "the offsets stored in the database are keyed by --group: set the group with \
                 --group",
    },
    Rule {
        key: "isolation.level",
        safe: "read_committed",
        allowed: |v, _| v.eq_ignore_ascii_case("read_committed"),
        reason: "read_uncommitted hands over records of aborted producer transactions, which \
                 would be applied",
    },
    Rule {
        key: "auto.offset.reset",
        safe: "earliest, smallest or beginning",
        allowed: |v, _| {
            ["smallest", "earliest", "beginning"]
                .iter()
                .any(|ok| v.eq_ignore_ascii_case(ok))
        },
        reason: "`latest` skips the records already in a partition when the group has no offset \
                 for it or its offset is out of range (they are never applied), and `error` \
                 stops the partition; to start a new group at the end of the topic, set its \
                 positions explicitly in the database, which the processor starts from (batch-inbox \
                 positions set --to-latest)",
    },
    Rule {
        key: "enable.partition.eof",
        safe: "what --exit-on-eof sets",
        allowed: |v, c| parse_bool(v) == Some(c.partition_eof),
        reason: "it follows --exit-on-eof (without end-of-partition events --exit-on-eof would \
                 never exit): use that flag",
    },
];

/// Checks the client configuration of `settings` against [`RULES`].
pub(crate) fn check(settings: &KafkaSettings, offsets_in_db: bool) -> Result<(), RefusedSetting> {
    let config = settings.client_config();
    let context = Context {
        group: &settings.group,
        partition_eof: settings.partition_eof,
        offsets_in_db,
    };
    for rule in RULES {
        match config.get(rule.key) {
            Some(value) if !(rule.allowed)(value, &context) => {
                return Err(RefusedSetting {
                    key: rule.key,
                    safe: rule.safe,
                    reason: rule.reason,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// A boolean the way librdkafka reads one.
fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" => Some(true),
        "false" | "f" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(overrides: &[(&str, &str)]) -> KafkaSettings {
        let mut s = KafkaSettings::new("127.0.0.1:9092", "t", "app");
        s.overrides = overrides
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        s
    }

    fn refused(overrides: &[(&str, &str)], offsets_in_db: bool) -> Option<&'static str> {
        check(&settings(overrides), offsets_in_db)
            .err()
            .map(|e| e.key)
    }

    #[test]
    fn the_defaults_and_harmless_overrides_pass() {
        assert_eq!(refused(&[], true), None);
        assert_eq!(refused(&[], false), None);
        let harmless = [
            ("fetch.min.bytes", "1"),
            ("partition.assignment.strategy", "range"),
            ("enable.auto.offset.store", "FALSE"),
            ("enable.auto.commit", "true"),
            ("group.id", "app"),
            ("isolation.level", "read_committed"),
            ("auto.offset.reset", "smallest"),
            ("enable.partition.eof", "false"),
        ];
        assert_eq!(refused(&harmless, false), None);
    }

    #[test]
    fn a_full_partition_queue_is_fetched_again_within_10_ms() {
        let c = settings(&[]).client_config();
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("10"));
        assert_eq!(c.get("queued.min.messages"), Some("10000"));
    }

    #[test]
    fn the_consumer_group_protocol_gets_no_classic_assignor() {
        let classic = settings(&[]).client_config();
        assert_eq!(
            classic.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        for v in ["consumer", " Consumer"] {
            let kip848 = settings(&[("group.protocol", v)]).client_config();
            assert_eq!(kip848.get("partition.assignment.strategy"), None, "{v}");
        }
        let back = settings(&[
            ("group.protocol", "consumer"),
            ("group.protocol", "classic"),
        ]);
        assert_eq!(
            back.client_config().get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
    }

    #[test]
    fn storing_offsets_on_delivery_is_refused() {
        for v in ["true", "t", "1", "yes"] {
            let err = check(&settings(&[("enable.auto.offset.store", v)]), true).unwrap_err();
            assert_eq!(err.key, "enable.auto.offset.store");
            let text = err.to_string();
            assert!(
                text.starts_with("refused -X enable.auto.offset.store (safe: false): ")
                    && text.contains("before the database COMMIT"),
                "{text}"
            );
        }
    }

    #[test]
    fn no_auto_commit_is_refused_only_without_offsets_in_the_database() {
        let off = [("enable.auto.commit", "false")];
        assert_eq!(refused(&off, false), Some("enable.auto.commit"));
        assert_eq!(refused(&off, true), None);
    }

    #[test]
    fn another_group_id_than_the_group_flag_is_refused() {
        assert_eq!(refused(&[("group.id", "other")], true), Some("group.id"));
        assert_eq!(refused(&[("group.id", "App")], true), Some("group.id"));
    }

    #[test]
    fn reading_uncommitted_records_is_refused() {
        let uncommitted = [("isolation.level", "read_uncommitted")];
        assert_eq!(refused(&uncommitted, true), Some("isolation.level"));
    }

    #[test]
    fn resetting_to_the_end_or_to_an_error_is_refused() {
        for v in ["latest", "largest", "end", "error", "LATEST"] {
            let reset = [("auto.offset.reset", v)];
            assert_eq!(refused(&reset, true), Some("auto.offset.reset"), "{v}");
        }
    }

    #[test]
    fn partition_eof_follows_exit_on_eof() {
        assert_eq!(
            refused(&[("enable.partition.eof", "true")], true),
            Some("enable.partition.eof")
        );
        let mut draining = settings(&[("enable.partition.eof", "false")]);
        draining.partition_eof = true;
        assert_eq!(
            check(&draining, true).map_err(|e| e.key),
            Err("enable.partition.eof")
        );
        draining.overrides[0].1 = "true".to_owned();
        assert_eq!(check(&draining, true), Ok(()));
    }

    #[test]
    fn the_last_value_of_a_property_decides() {
        let fixed = [
            ("enable.auto.offset.store", "true"),
            ("enable.auto.offset.store", "false"),
        ];
        assert_eq!(refused(&fixed, true), None);
    }
}
