use super::*;
use crate::reason::ReasonCounts;
use std::time::{Duration, Instant};

#[test]
fn rejection_names_beyond_the_limit_share_one_series() {
    let t = Telemetry::default();
    let names: Vec<Reason> = (0..MAX_REJECTION_LABELS + 5)
        .map(|i| Reason::Rejected(crate::reason::RejectReason::new(format!("r{i}")).unwrap()))
        .collect();
    let outcome = TxOutcome {
        dead_letter_reasons: ReasonCounts::of(&names),
        ..TxOutcome::default()
    };
    let opened = Instant::now();
    let sample = BatchSample {
        opened,
        closed: opened,
        timings: Default::default(),
        offset_store: Duration::ZERO,
        timestamps_ms: &[],
    };
    t.record_batch(&outcome, &sample, UNIX_EPOCH);
    t.record_batch(&outcome, &sample, UNIX_EPOCH);
    let text = t.encode();
    let series = text
        .lines()
        .filter(|l| l.starts_with("batch_inbox_dead_letters_total{reason=\"r"))
        .count();
    assert_eq!(series, MAX_REJECTION_LABELS, "{text}");
    assert!(
        text.contains("batch_inbox_dead_letters_total{reason=\"_other\"} 10"),
        "{text}"
    );
    assert!(text.contains("batch_inbox_dead_letters_total{reason=\"missing_id\"} 0"));
}

#[test]
fn a_committed_batch_moves_each_counter_by_its_outcome() {
    let t = Telemetry::default();
    let funds = Reason::rejected("insufficient_funds");
    let reasons = ReasonCounts::of([&funds, &funds]);
    let outcome = TxOutcome {
        received: 10,
        new: 7,
        duplicates: 2,
        dead_letter_reasons: reasons,
        ..TxOutcome::default()
    };
    let opened = Instant::now();
    let sample = BatchSample {
        opened,
        closed: opened + Duration::from_millis(3),
        timings: Default::default(),
        offset_store: Duration::ZERO,
        timestamps_ms: &[Some(1_000), Some(1_500), None],
    };
    t.record_batch(&outcome, &sample, UNIX_EPOCH + Duration::from_secs(2));
    t.set_lags(BTreeMap::from([(("t".to_owned(), 3), 42)]));
    t.set_lags(BTreeMap::from([(("t".to_owned(), 4), 5)]));
    let text = t.encode();
    for line in [
        "batch_inbox_messages_consumed_total 10",
        "batch_inbox_messages_new_total 7",
        "batch_inbox_duplicates_skipped_total 2",
        "batch_inbox_dead_letters_total{reason=\"insufficient_funds\"} 2",
        "batch_inbox_dead_letters_total{reason=\"missing_id\"} 0",
        "batch_inbox_batches_committed_total 1",
        "batch_inbox_end_to_end_latency_seconds_count 2",
        "batch_inbox_end_to_end_latency_seconds_sum 1.5",
        "batch_inbox_stage_duration_seconds_count{stage=\"batch_wait\"} 1",
        "batch_inbox_consumer_lag_messages{topic=\"t\",partition=\"4\"} 5",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(
        !text.contains("partition=\"3\""),
        "a revoked partition keeps no lag series"
    );
    assert_eq!(t.total_lag(), (5, 1));
}

#[test]
fn producer_set_timestamps_at_the_ends_of_i64_do_not_overflow() {
    let t = Telemetry::default();
    let opened = Instant::now();
    let sample = BatchSample {
        opened,
        closed: opened,
        timings: Default::default(),
        offset_store: Duration::ZERO,
        timestamps_ms: &[Some(i64::MAX), Some(i64::MIN)],
    };
    t.record_batch(&TxOutcome::default(), &sample, UNIX_EPOCH);
    // A timestamp in the future counts as 0 s, one at i64::MIN as i64::MAX ms.
    let sum = i64::MAX as f64 / 1000.0;
    let text = t.encode();
    assert!(
        text.contains("batch_inbox_end_to_end_latency_seconds_count 2"),
        "{text}"
    );
    assert!(text.contains(&format!("batch_inbox_end_to_end_latency_seconds_sum {sum}")));
}
