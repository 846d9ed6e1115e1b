//! No record can stop the processor: a seeded generator mixes records with random bytes in key,
//! value, header names and header values (NUL, invalid UTF-8, empty and null values, thousands of
//! headers, more than librdkafka parses, duplicate id headers, nil and max UUIDs, values above the
//! batch byte limit, producer timestamps at the epoch) with the ledger generator's records, in the same
//! partitions, through a real broker (Apache Kafka). The processor must drain the topic without an error, and
//! every Kafka position must be accounted for exactly once: a dead letter with the reason the
//! input rules give, an inbox row (a new id), or nothing (a valid duplicate), as the model says;
//! the balances must equal the model's. `HOSTILE_SEED` picks another seed.

use crate::common;
use crate::common::raw_producer;
use crate::common::scenario::Scenario;
use std::collections::{BTreeMap, HashMap, HashSet};

use batch_inbox::ledger::Entry;
use batch_inbox::Mode;
use batch_inbox_tools::generate::{Generator, GeneratorSettings, Model, Record};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use raw_producer::RawRecord;
use uuid::Uuid;

const PARTITIONS: i32 = 4;
const BATCH_MAX_BYTES: usize = 64 * 1024;

/// What must become of one Kafka position.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// A dead letter with this reason, and no inbox row.
    Dead(&'static str),
    /// An inbox row (a new valid id); a rejection dead letter may come with it.
    New,
    /// Nothing: a valid copy of an earlier id.
    Duplicate,
}

/// The fate of a generator record, by the wire contract (one id header, a UUID other than
/// nil/max, a JSON object value), in production order.
fn ledger_fate(r: &Record, seen: &mut HashSet<Uuid>) -> Fate {
    let Some(id) = &r.id else {
        return Fate::Dead("missing_id");
    };
    let Ok(id) = Uuid::try_parse(id.trim()) else {
        return Fate::Dead("invalid_id");
    };
    match Entry::parse(r.value.as_deref()) {
        // The decoder's reasons are the pipeline's own: their texts are fixed.
        Err((reason, _)) => Fate::Dead(match reason {
            batch_inbox::Reason::EmptyPayload => "empty_payload",
            _ => "invalid_payload",
        }),
        Ok(_) if seen.insert(id) => Fate::New,
        Ok(_) => Fate::Duplicate,
    }
}

fn bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let n = rng.random_range(0..=max);
    (0..n)
        .map(|_| match rng.random_range(0..4) {
            0 => 0,
            1 => rng.random_range(0x80..=0xff),
            _ => rng.random(),
        })
        .collect()
}

/// Random headers whose names never read as `id` (librdkafka cuts a name at its first NUL).
fn junk_headers(rng: &mut StdRng) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let count = match rng.random_range(0..10) {
        0..=4 => 0,
        5..=7 => rng.random_range(1..6),
        8 => 300,
        _ => 3_000,
    };
    (0..count)
        .map(|_| {
            let mut name = bytes(rng, 12);
            if name.split(|b| *b == 0).next() == Some(&b"id"[..]) {
                name.insert(0, b'x');
            }
            let value = match rng.random_range(0..4) {
                0 => None,
                1 => Some(Vec::new()),
                _ => Some(bytes(rng, 40)),
            };
            (name, value)
        })
        .collect()
}

/// A random UUIDv4's text, from the seed.
fn fresh(rng: &mut StdRng) -> Vec<u8> {
    let id = uuid::Builder::from_random_bytes(rng.random()).into_uuid();
    id.to_string().into_bytes()
}

/// A record no input rule accepts, and the reason it must get.
fn hostile(rng: &mut StdRng) -> (RawRecord, &'static str) {
    let (id_headers, id_reason): (Vec<Option<Vec<u8>>>, Option<&str>) =
        match rng.random_range(0..13) {
            0 => (vec![], Some("missing_id")),
            1 => (vec![None], Some("missing_id")),
            2 => (
                vec![Some([&fresh(rng)[..], b"\0", &bytes(rng, 8)].concat())],
                Some("invalid_id"),
            ),
            3 => (
                vec![Some([&[0xff][..], &bytes(rng, 40)].concat())],
                Some("invalid_id"),
            ),
            4 => (
                vec![Some(Uuid::nil().to_string().into_bytes())],
                Some("invalid_id"),
            ),
            5 => (
                vec![Some(Uuid::max().to_string().into_bytes())],
                Some("invalid_id"),
            ),
            6 => (vec![Some(fresh(rng)), Some(fresh(rng))], Some("invalid_id")),
            7 => (vec![None, Some(fresh(rng))], Some("invalid_id")),
            8 => (
                vec![Some([&b"#"[..], &bytes(rng, 60)].concat())],
                Some("invalid_id"),
            ),
            9 => (vec![Some(vec![b'x'; 100_000])], Some("invalid_id")),
            10 => (vec![Some(Vec::new())], Some("invalid_id")),
            _ => (vec![Some(fresh(rng))], None),
        };
    let (value, value_reason) = match rng.random_range(0..6) {
        0 => (None, "empty_payload"),
        1 => (Some(Vec::new()), "empty_payload"),
        2 => (
            Some([&b"#"[..], &bytes(rng, 150_000)].concat()),
            "invalid_payload",
        ),
        _ => (
            Some([&b"#"[..], &bytes(rng, 200)].concat()),
            "invalid_payload",
        ),
    };
    // A tombstone the ledger dead-letters is one whatever its id; any other record's id counts
    // first.
    let reason = match (&value, id_reason) {
        (None, _) => "empty_payload",
        (Some(_), id_reason) => id_reason.unwrap_or(value_reason),
    };
    let mut headers = junk_headers(rng);
    for id in id_headers {
        let at = rng.random_range(0..=headers.len());
        headers.insert(at, (b"id".to_vec(), id));
    }
    // The broker refuses timestamps far in the future (InvalidTimestamp): the ends of i64 are
    // unit tests of the metrics; here the epoch's first millisecond.
    let timestamp_ms = rng.random_bool(0.1).then_some(1);
    let record = RawRecord {
        partition: rng.random_range(0..PARTITIONS),
        key: rng.random_bool(0.8).then(|| bytes(rng, 30)),
        value,
        headers,
        timestamp_ms,
    };
    (record, reason)
}

/// More headers than librdkafka parses (100,000): the record has no readable id header.
fn too_many_headers() -> (RawRecord, &'static str) {
    let record = RawRecord {
        partition: 0,
        value: Some(b"{}".to_vec()),
        headers: vec![(b"h".to_vec(), None); 100_001],
        ..RawRecord::default()
    };
    (record, "missing_id")
}

/// The input in production order, each record with its fate, and the model of the ledger.
fn input(seed: u64) -> (Vec<(RawRecord, Fate)>, Model) {
    let settings = GeneratorSettings {
        messages: 2_500,
        accounts: 40,
        duplicate_ratio: 0.1,
        bad_ratio: 0.02,
        debit_ratio: 0.4,
        id_version: 4,
        seed,
        ..GeneratorSettings::default()
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut model, mut seen) = (Model::default(), HashSet::new());
    let mut out = vec![];
    for r in Generator::new(settings) {
        model.apply(&r);
        let fate = ledger_fate(&r, &mut seen);
        let account: i32 = r.key.parse().expect("the generator keys by account");
        let mut headers = junk_headers(&mut rng);
        let at = rng.random_range(0..=headers.len());
        if let Some(id) = &r.id {
            headers.insert(at, (b"id".to_vec(), Some(id.clone().into_bytes())));
        }
        let record = RawRecord {
            partition: account % PARTITIONS,
            key: Some(r.key.into_bytes()),
            value: r.value,
            headers,
            timestamp_ms: None,
        };
        out.push((record, fate));
        if rng.random_bool(0.3) {
            let (record, reason) = hostile(&mut rng);
            out.push((record, Fate::Dead(reason)));
        }
    }
    let (record, reason) = too_many_headers();
    out.insert(out.len() / 2, (record, Fate::Dead(reason)));
    (out, model)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_record_is_dead_lettered_once_and_the_ledger_matches_its_model() {
    let seed = std::env::var("HOSTILE_SEED").map_or(20_251_130, |s| s.parse().unwrap());
    let (records, model) = input(seed);
    // Each record's position: its partition and the count of records sent there before it.
    let mut next = vec![0i64; PARTITIONS as usize];
    let mut fates: BTreeMap<(i32, i64), Fate> = BTreeMap::new();
    for (record, fate) in &records {
        let offset = &mut next[record.partition as usize];
        fates.insert((record.partition, *offset), fate.clone());
        *offset += 1;
    }
    let world = Scenario::new("hostile_records")
        .topic("hostile")
        .partitions(PARTITIONS)
        .records(records.iter().map(|(record, _)| record.clone()))
        .build()
        .await;
    let pool = world.pool.clone();

    let mut cfg = config(world.settings("g"), Mode::Batched, 500);
    cfg.worker.batcher.max_bytes = BATCH_MAX_BYTES.try_into().unwrap();
    let stats = drain(cfg, &pool).await; // panics unless the processor returned Ok

    let expected = model.expected();
    assert_eq!(
        stats.records,
        records.len() as u64,
        "every record read once"
    );
    assert_eq!(stats.duplicates, expected.duplicates);
    let t = tables(&pool).await;
    let balances: Vec<(i64, i64)> = expected.balances.iter().map(|(a, b)| (*a, *b)).collect();
    assert_eq!(t.balances, balances, "the ledger equals its model");
    let inbox: HashSet<(i32, i64)> = t.inbox.iter().map(|(_, p, o)| (*p, *o)).collect();
    assert_eq!(inbox.len(), t.inbox.len());
    let dead: HashMap<(i32, i64), &str> = t
        .dead_letters
        .iter()
        .map(|d| ((d.0, d.1), d.3.as_str()))
        .collect();
    let rejections = ["insufficient_funds", "amount_overflow"];
    for (position, fate) in &fates {
        let (row, letter) = (inbox.contains(position), dead.get(position).copied());
        match fate {
            Fate::Dead(reason) => assert_eq!((row, letter), (false, Some(*reason)), "{position:?}"),
            Fate::Duplicate => assert_eq!((row, letter), (false, None), "{position:?}"),
            Fate::New => assert!(
                row && letter.is_none_or(|r| rejections.contains(&r)),
                "{position:?}: inbox row {row}, dead letter {letter:?}"
            ),
        }
    }
    let positions: HashSet<&(i32, i64)> = fates.keys().collect();
    assert!(
        inbox
            .iter()
            .chain(dead.keys())
            .all(|p| positions.contains(p)),
        "no foreign row"
    );
    let mut rejected: BTreeMap<String, u64> = BTreeMap::new();
    for reason in dead.values().filter(|r| rejections.contains(r)) {
        *rejected.entry((*reason).to_owned()).or_default() += 1;
    }
    let model_rejected: BTreeMap<String, u64> = expected
        .dead_letters
        .iter()
        .filter(|(r, _)| rejections.contains(&r.as_str()))
        .map(|(r, n)| (r.clone(), *n))
        .collect();
    assert_eq!(rejected, model_rejected);
    let hostile = records.len() as u64 - expected.records;
    assert!(hostile > 500, "{hostile} hostile records");
}
