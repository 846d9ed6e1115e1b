//! A producer that writes any bytes, header names included, through librdkafka's C API:
//! `rd_kafka_produceva` with a header list built by `rd_kafka_header_add` with explicit sizes
//! (rdkafka's `OwnedHeaders` takes names as `&str`, and librdkafka's `VTYPE_HEADER` measures a
//! name with `strlen`, so neither can send a non-UTF-8 name or one containing NUL).
//! Used as `common::raw_producer`.
#![allow(dead_code)]

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};
use rdkafka_sys::bindings as sys;
use rdkafka_sys::types::RDKafkaRespErr;

/// One record, every field as bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawRecord {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Names and values; `None` is a null value.
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Producer-set timestamp (`None`: the send time).
    pub timestamp_ms: Option<i64>,
}

/// Counts delivery reports.
#[derive(Default)]
pub struct Deliveries {
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.delivered.fetch_add(1, Ordering::SeqCst),
            Err((e, _)) => {
                self.first_error
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| e.to_string());
                self.failed.fetch_add(1, Ordering::SeqCst)
            }
        };
    }
}

pub struct RawProducer {
    producer: BaseProducer<Deliveries>,
    topic: CString,
    sent: u64,
}

impl RawProducer {
    /// An idempotent producer (per-partition order kept across retries) for `topic`.
    pub fn new(brokers: &str, topic: &str) -> Self {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.max.bytes", "10000000")
            .set("message.timeout.ms", "60000")
            .create_with_context(Deliveries::default())
            .expect("a producer");
        RawProducer {
            producer,
            topic: CString::new(topic).expect("a topic name without NUL"),
            sent: 0,
        }
    }

    /// Hands `r` to librdkafka, waiting while its queue is full.
    pub fn send(&mut self, r: &RawRecord) {
        loop {
            match self.try_send(r) {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => {
                    self.sent += 1;
                    return;
                }
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__QUEUE_FULL => {
                    self.producer.poll(Duration::from_millis(50));
                }
                e => panic!("produce refused: {e:?}"),
            }
        }
    }

    fn try_send(&self, r: &RawRecord) -> RDKafkaRespErr {
        let mem = |b: &Option<Vec<u8>>| match b {
            Some(b) => sys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                ptr: b.as_ptr() as *mut c_void,
                size: b.len(),
            },
            None => sys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                ptr: std::ptr::null_mut(),
                size: 0,
            },
        };
        let vu = |vtype, u| sys::rd_kafka_vu_t { vtype, u };
        use sys::rd_kafka_vtype_t::*;
        // SAFETY: every pointer handed to librdkafka is valid for the call: the headers are
        // copied by `rd_kafka_header_add`, key and value by RD_KAFKA_MSG_F_COPY, the topic name
        // lives in `self`. The header list is owned by the message on success and destroyed
        // here on failure, as librdkafka's contract says.
        unsafe {
            let list = sys::rd_kafka_headers_new(r.headers.len());
            for (name, value) in &r.headers {
                let (ptr, len) = match value {
                    Some(v) => (v.as_ptr() as *const c_void, v.len() as isize),
                    None => (std::ptr::null(), 0),
                };
                let name_ptr = name.as_ptr().cast();
                sys::rd_kafka_header_add(list, name_ptr, name.len() as isize, ptr, len);
            }
            type U = sys::rd_kafka_vu_s__bindgen_ty_1;
            let vus = [
                vu(
                    RD_KAFKA_VTYPE_TOPIC,
                    U {
                        cstr: self.topic.as_ptr(),
                    },
                ),
                vu(RD_KAFKA_VTYPE_PARTITION, U { i32_: r.partition }),
                vu(
                    RD_KAFKA_VTYPE_MSGFLAGS,
                    U {
                        i: sys::RD_KAFKA_MSG_F_COPY,
                    },
                ),
                vu(RD_KAFKA_VTYPE_KEY, U { mem: mem(&r.key) }),
                vu(RD_KAFKA_VTYPE_VALUE, U { mem: mem(&r.value) }),
                vu(
                    RD_KAFKA_VTYPE_TIMESTAMP,
                    U {
                        i64_: r.timestamp_ms.unwrap_or(0),
                    },
                ),
                vu(RD_KAFKA_VTYPE_HEADERS, U { headers: list }),
            ];
            let rk = self.producer.client().native_ptr();
            let error = sys::rd_kafka_produceva(rk, vus.as_ptr(), vus.len());
            if error.is_null() {
                return RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR;
            }
            let code = sys::rd_kafka_error_code(error);
            sys::rd_kafka_error_destroy(error);
            sys::rd_kafka_headers_destroy(list);
            code
        }
    }

    /// Waits for every delivery report; panics unless every record was delivered.
    pub fn flush(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let ctx = self.producer.context();
        while ctx.delivered.load(Ordering::SeqCst) + ctx.failed.load(Ordering::SeqCst) < self.sent {
            assert!(Instant::now() < deadline, "deliveries within 60 s");
            self.producer.poll(Duration::from_millis(50));
        }
        let failed = ctx.failed.load(Ordering::SeqCst);
        let first = ctx.first_error.lock().unwrap().clone();
        assert_eq!(failed, 0, "every record delivered; first error: {first:?}");
    }
}
