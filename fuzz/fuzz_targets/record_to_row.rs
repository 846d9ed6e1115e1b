//! From arbitrary bytes to a record, through decoding, to the dead-letter row values and the
//! latency metrics: nothing panics, and every row value is storable (text without NUL, bounded
//! where the text comes from the record, headers kept losslessly).
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use batch_inbox::internals::dead_letter::{row, RowForm, MAX_DETAIL_BYTES};
use batch_inbox::internals::inbox::StageTimings;
use batch_inbox::internals::message::{decode_batch, MAX_ID_TEXT_BYTES};
use batch_inbox::internals::metrics::{BatchSample, Metrics};
use batch_inbox::ledger::Entry;
use batch_inbox::{Header, IdRules, RawMessage};
use bytes::Bytes;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[derive(Debug, Arbitrary)]
struct Input {
    offset: i64,
    timestamp_ms: Option<i64>,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    header_error: Option<String>,
}

fuzz_target!(|input: Input| {
    let raw = RawMessage {
        topic: Arc::from("t"),
        partition: 0,
        offset: input.offset,
        timestamp_ms: input.timestamp_ms,
        key: input.key.map(Bytes::from),
        payload: input.payload.map(Bytes::from),
        headers: input
            .headers
            .into_iter()
            .map(|(k, v)| Header {
                key: Bytes::from(k),
                value: v.map(Bytes::from),
            })
            .collect(),
        header_error: input.header_error,
    };
    let _ = raw.size_bytes();
    let opened = Instant::now();
    Metrics::default().record_batch(
        &BatchSample {
            opened,
            closed: opened,
            timings: StageTimings::default(),
            offset_store: Duration::ZERO,
            timestamps_ms: &[raw.timestamp_ms],
        },
        UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    );
    let decoded = decode_batch::<Entry>(vec![raw.clone()], "id");
    assert_eq!(decoded.messages.len() + decoded.dead_letters.len(), 1);
    for m in &decoded.messages {
        assert!(!m.id.is_nil() && !m.id.is_max());
        assert_eq!(m.raw.headers_named("id").count(), 1);
    }
    for letter in &decoded.dead_letters {
        let ids = IdRules::header("id");
        for form in [RowForm::full(&ids), RowForm::minimal(&ids, "23514")] {
            let r = row(letter, form);
            assert!(r.detail.len() <= MAX_DETAIL_BYTES && !r.detail.contains('\0'));
            if let Some(id) = r.message_id {
                assert!(id.len() <= MAX_ID_TEXT_BYTES && !id.contains('\0'));
            }
            assert_eq!(r.key, raw.key.as_deref());
            assert_eq!(r.payload, raw.payload.as_deref());
            if let Some(headers) = &r.headers {
                assert_storable(headers);
                assert_lossless(headers, &raw.headers);
            }
        }
    }
});

/// No string in the JSON (object keys included) holds a NUL: jsonb refuses `\u0000`.
fn assert_storable(v: &Value) {
    match v {
        Value::String(s) => assert!(!s.contains('\0')),
        Value::Array(a) => a.iter().for_each(assert_storable),
        Value::Object(o) => o.iter().for_each(|(k, v)| {
            assert!(!k.contains('\0'));
            assert_storable(v)
        }),
        _ => {}
    }
}

/// The JSON gives back every header's name and value, byte for byte.
fn assert_lossless(json: &Value, headers: &[Header]) {
    let entries = json.as_array().expect("an array");
    assert_eq!(entries.len(), headers.len());
    for (e, h) in entries.iter().zip(headers) {
        let text_or_hex = |text: &str, hex: &str| match (e.get(text), e.get(hex)) {
            (Some(Value::String(s)), None) => Some(s.as_bytes().to_vec()),
            (Some(Value::Null), None) => None,
            (None, Some(Value::String(h))) => Some(unhex(h)),
            other => panic!("{other:?}"),
        };
        assert_eq!(text_or_hex("key", "key_hex").as_deref(), Some(&h.key[..]));
        assert_eq!(
            text_or_hex("value", "value_hex").as_deref(),
            h.value.as_deref()
        );
    }
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("hex"))
        .collect()
}
