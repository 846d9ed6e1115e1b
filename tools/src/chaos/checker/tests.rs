use super::*;

fn expected(balances: &[(i64, i64)]) -> Expected {
    Expected {
        balances: balances.iter().copied().collect(),
        ..Expected::default()
    }
}

#[test]
fn balances_report_double_application_and_loss() {
    let model = expected(&[(1, 10), (2, 5)]);
    let doubled: BTreeMap<i64, i64> = [(1, 20), (2, 5)].into_iter().collect();
    let sum = sum_of_balances(&doubled, &model);
    assert!(
        !sum.ok && sum.detail.contains("10 too much"),
        "{}",
        sum.detail
    );
    let each = every_balance(&doubled, &model);
    assert!(
        !each.ok && each.detail.starts_with("1 accounts differ"),
        "{}",
        each.detail
    );
    let lost: BTreeMap<i64, i64> = [(1, 10)].into_iter().collect();
    assert!(sum_of_balances(&lost, &model).detail.contains("5 missing"));
    assert!(!every_balance(&lost, &model).ok);
    // An account that only saw rejected debits exists at 0 and is absent from the model.
    let zero: BTreeMap<i64, i64> = [(1, 10), (2, 5), (3, 0)].into_iter().collect();
    assert!(every_balance(&zero, &model).ok && sum_of_balances(&zero, &model).ok);
}

#[test]
fn inbox_ids_must_equal_the_valid_ids() {
    let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
    let valid: HashSet<Uuid> = [a, b].into();
    assert!(inbox_ids(&[a, b].into(), &valid).ok);
    let lost = inbox_ids(&[a].into(), &valid);
    assert!(
        !lost.ok && lost.detail.contains("1 valid ids missing"),
        "{}",
        lost.detail
    );
    assert!(!inbox_ids(&[a, b, c].into(), &valid).ok);
}

#[test]
fn valid_ids_skip_bad_input() {
    let good = |id: &str| Record {
        key: "1".into(),
        value: Some(br#"{"account_id":1,"amount":5}"#.to_vec()),
        id: Some(id.into()),
    };
    let id = Uuid::from_u128(9).to_string();
    let mut empty = good(&id);
    empty.value = Some(Vec::new());
    let records = [good(&id), good(&id), good("not-a-uuid"), empty];
    assert_eq!(valid_ids(&records), [Uuid::from_u128(9)].into());
}

#[test]
fn a_regression_right_after_a_resume_is_tolerated_unless_strict() {
    let at = |at_s| Regression {
        partition: 1,
        from: 10,
        to: 5,
        at_s,
    };
    let samples = Samples {
        samples: 10,
        regressions: vec![at(20.5)],
        ..Samples::default()
    };
    let lenient = offsets_monotonic(&samples, &[20.0], &[], false);
    assert!(
        lenient.ok && lenient.detail.contains("tolerated"),
        "{}",
        lenient.detail
    );
    assert!(!offsets_monotonic(&samples, &[20.0], &[], true).ok);
    assert!(!offsets_monotonic(&samples, &[10.0], &[], false).ok);
    assert!(
        offsets_monotonic(
            &Samples {
                samples: 3,
                ..Samples::default()
            },
            &[],
            &[],
            true
        )
        .ok
    );
}

#[test]
fn after_a_failover_a_committed_offset_moves_back_to_the_databases_position_never_below() {
    let back = |partition, to, at_s| Regression {
        partition,
        from: 500,
        to,
        at_s,
    };
    let samples = |regressions| Samples {
        samples: 10,
        regressions,
        ..Samples::default()
    };
    let failover = Failover {
        at_s: 30.0,
        positions: BTreeMap::from([(1, 400)]),
    };
    let check = |r: Vec<Regression>, strict| {
        offsets_monotonic(&samples(r), &[], std::slice::from_ref(&failover), strict)
    };
    // To the promoted database's position, or above it (the database moved on before the
    // member noticed): the processors following the database, also when strict.
    for to in [400, 450] {
        let followed = check(vec![back(1, to, 31.0)], true);
        assert!(
            followed.ok && followed.detail.contains("after a failover"),
            "{}",
            followed.detail
        );
    }
    // Below it: a violation.
    assert!(!check(vec![back(1, 399, 31.0)], false).ok);
    // A partition the promoted database had no row for starts at its beginning.
    assert!(check(vec![back(2, 0, 31.0)], true).ok);
    // Before the failover, a move back is a regression as always.
    assert!(!check(vec![back(1, 400, 29.0)], false).ok);
}

#[test]
fn lag_and_fault_counts() {
    let at = |committed, high| PartitionLag {
        partition: 0,
        committed,
        high_watermark: high,
    };
    for strict in [true, false] {
        assert!(lag_zero(&[at(Some(5), 5)], strict).ok);
        assert!(!lag_zero(&[at(Some(4), 5)], strict).ok);
        assert!(!lag_zero(&[at(None, 5)], strict).ok);
        assert!(lag_zero(&[at(None, 0)], strict).ok);
        assert!(!lag_zero(&[], strict).ok);
    }
    let ahead = lag_zero(&[at(Some(6), 5)], false);
    assert!(
        ahead.ok && ahead.detail.contains("past the broker's"),
        "{}",
        ahead.detail
    );
    let strict = lag_zero(&[at(Some(6), 5)], true);
    assert!(!strict.ok, "an end below served records: {}", strict.detail);
    assert!(faults_hit(&[("kills", 2), ("retries", 1)]).ok);
    let none = faults_hit(&[("kills", 2), ("replays", 0)]);
    assert!(
        !none.ok && none.detail.contains("none of: replays"),
        "{}",
        none.detail
    );
}

#[test]
fn on_rabbitmq_only_bad_input_may_be_dead_lettered_again_and_no_more_than_redelivered() {
    let mut model = expected(&[]);
    model.dead_letters = [
        ("missing_id".to_owned(), 3),
        ("insufficient_funds".to_owned(), 2),
    ]
    .into_iter()
    .collect();
    let slack = DeadLetterSlack {
        bad_input: ["missing_id".to_owned()].into_iter().collect(),
        extra_deliveries: 1,
    };
    let dead = |m: u64, f: u64| -> BTreeMap<String, u64> {
        [
            ("missing_id".to_owned(), m),
            ("insufficient_funds".to_owned(), f),
        ]
        .into_iter()
        .collect()
    };
    assert!(dead_letters(&dead(3, 2), &model, None).ok);
    assert!(!dead_letters(&dead(4, 2), &model, None).ok, "Kafka: exact");
    assert!(dead_letters(&dead(4, 2), &model, Some(&slack)).ok);
    assert!(
        !dead_letters(&dead(5, 2), &model, Some(&slack)).ok,
        "more than redelivered"
    );
    assert!(
        !dead_letters(&dead(3, 3), &model, Some(&slack)).ok,
        "a rejection twice"
    );
    assert!(
        !dead_letters(&dead(2, 2), &model, Some(&slack)).ok,
        "a loss"
    );
}
