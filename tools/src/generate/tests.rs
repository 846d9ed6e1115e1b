use super::*;

#[test]
fn same_seed_same_input_and_every_kind_appears() {
    let s = GeneratorSettings {
        messages: 5_000,
        accounts: 20,
        bad_ratio: 0.05,
        duplicate_ratio: 0.2,
        debit_ratio: 0.5,
        id_version: 4,
        seed: 7,
        keys: KeyDistribution::Uniform,
    };
    let (a, ea) = generate(s.clone());
    let (b, eb) = generate(s);
    assert_eq!(a, b);
    assert_eq!(ea, eb);
    assert_eq!(ea.records, 5_000);
    let dead: u64 = ea.dead_letters.values().sum();
    assert_eq!(
        ea.new + ea.duplicates + dead - ea.dead_letters["insufficient_funds"],
        5_000
    );
    for reason in [
        "missing_id",
        "invalid_id",
        "empty_payload",
        "invalid_payload",
        "insufficient_funds",
    ] {
        assert!(
            ea.dead_letters.get(reason).copied().unwrap_or(0) > 0,
            "{reason}"
        );
    }
    assert!(ea.duplicates > 500, "{}", ea.duplicates);
    assert!(ea.balances.values().all(|b| *b >= 0));
    // Without the rules: every new entry counts, overdrafts included.
    let summed = ea.summed();
    assert!(summed.balances.values().any(|b| *b < 0));
    assert_eq!(summed.total(), ea.total() + overdrafts(&a));
    assert!(!summed.dead_letters.contains_key("insufficient_funds"));
    assert_eq!(
        summed.dead_letters["missing_id"],
        ea.dead_letters["missing_id"]
    );
    assert!(ea.json_not_entries > 0 && summed.new == ea.new + ea.json_not_entries);
}

/// The sum of the amounts the ledger refuses in `records`.
fn overdrafts(records: &[Record]) -> i64 {
    let (mut seen, mut balances, mut refused) = (HashSet::new(), BTreeMap::new(), 0);
    for r in records {
        let id = r.id.as_deref().and_then(|s| parse_id(s.as_bytes()).ok());
        let Some(id) = id else { continue };
        let Ok(entry) = Entry::parse(r.value.as_deref()) else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        let balance = balances.entry(entry.account_id).or_insert(0i64);
        match apply_amount(*balance, entry.amount) {
            Ok(next) => *balance = next,
            Err(_) => refused += entry.amount,
        }
    }
    refused
}

#[test]
fn zipf_keys_favour_low_accounts() {
    let accounts = Accounts::new(1_000, KeyDistribution::Zipf);
    let mut rng = StdRng::seed_from_u64(3);
    let draws: Vec<i64> = (0..10_000).map(|_| accounts.draw(&mut rng)).collect();
    assert!(draws.iter().all(|a| (1..=1_000).contains(a)));
    let hot = draws.iter().filter(|a| **a == 1).count();
    // P(1) = 1 / H(1000) ≈ 0.134
    assert!((1_100..1_600).contains(&hot), "{hot}");
}

#[test]
fn connect_envelope_wraps_valid_entries_and_leaves_bad_records_alone() {
    let s = GeneratorSettings {
        messages: 2_000,
        accounts: 10,
        bad_ratio: 0.05,
        duplicate_ratio: 0.1,
        id_version: 4,
        ..GeneratorSettings::default()
    };
    let (records, expected) = generate(s);
    let (mut wrapped, mut left) = (0, 0);
    for r in records {
        let w = ValueEnvelope::ConnectJson.write(r.clone());
        assert_eq!((&w.key, &w.id), (&r.key, &r.id));
        match Entry::parse(r.value.as_deref()) {
            Ok(entry) if r.id.is_some() => {
                let v: serde_json::Value = serde_json::from_slice(w.value.as_deref().unwrap())
                    .expect("the envelope is JSON");
                assert_eq!(v["schema"]["type"], "struct");
                assert_eq!(v["schema"]["fields"].as_array().unwrap().len(), 3);
                assert_eq!(
                    v["payload"],
                    serde_json::json!({"id": r.id.as_deref().unwrap(),
                        "account_id": entry.account_id, "amount": entry.amount})
                );
                wrapped += 1;
            }
            _ => {
                assert_eq!(w, r);
                left += 1;
            }
        }
        assert_eq!(ValueEnvelope::Bare.write(r.clone()), r);
    }
    assert_eq!(wrapped + left, 2_000);
    // A record with an id header that is no UUID is wrapped too (its value is an entry).
    assert_eq!(
        wrapped,
        expected.new + expected.duplicates + expected.dead_letters["invalid_id"]
    );
    // Every account that got a valid record has a last one, and the last new one is among
    // the ids the model counted as new.
    assert_eq!(expected.last_new.len(), expected.last_sent.len());
    assert!(!expected.last_new.is_empty());
}
