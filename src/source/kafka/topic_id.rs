//! Kafka topic ids (KIP-516): what tells a topic from another of the same name, once the first
//! was deleted and the second created. Read with the standard admin request DescribeTopics
//! through librdkafka's C API on the consumer's own client (rdkafka 0.39 has no binding for it).
//!
//! Invariant: an id is reported only when the broker gave one; a broker that has no topic ids
//! (older Kafka, some compatible brokers) answers the all-zero id, reported as `None`, and the
//! caller then has nothing to compare.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::raw::c_char;
use std::time::Duration;

use rdkafka_sys::bindings as sys;
use uuid::Uuid;

/// What DescribeTopics said of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Described {
    /// The topic exists, with this id (`None`: the broker has no topic ids).
    Id(Option<Uuid>),
    /// The broker refused to describe it (unknown topic, authorization): why.
    Refused(String),
}

/// Whether the cluster of client `rk` can describe topics: DescribeTopics goes to the
/// controller that the brokers' metadata names, and a cluster whose metadata names no broker of
/// its own as controller (librdkafka's mock cluster names 0) would leave the request waiting
/// until its timeout. Answers from the client's metadata (fetched within `timeout` if it has
/// none yet), never after a DescribeTopics timeout. Blocking.
///
/// # Safety
///
/// `rk` must be a live librdkafka client handle for the whole call.
pub(crate) unsafe fn can_describe(
    rk: *mut sys::rd_kafka_t,
    timeout: Duration,
) -> Result<bool, String> {
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the metadata is created here, read, and destroyed once on every path.
    unsafe {
        let controller = sys::rd_kafka_controllerid(rk, millis);
        if controller < 0 {
            return Ok(false);
        }
        let mut metadata: *const sys::rd_kafka_metadata = std::ptr::null();
        let err = sys::rd_kafka_metadata(rk, 0, std::ptr::null_mut(), &mut metadata, millis);
        if err != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || metadata.is_null() {
            return Err(format!(
                "cannot read the cluster's metadata: {}",
                text(sys::rd_kafka_err2str(err))
            ));
        }
        let m = &*metadata;
        let brokers =
            std::slice::from_raw_parts(m.brokers, usize::try_from(m.broker_cnt).unwrap_or(0));
        let known = brokers.iter().any(|b| b.id == controller);
        sys::rd_kafka_metadata_destroy(metadata);
        Ok(known)
    }
}

/// Describes `topics` through client `rk` within `timeout`. Blocking.
///
/// # Safety
///
/// `rk` must be a live librdkafka client handle for the whole call.
pub(crate) unsafe fn describe(
    rk: *mut sys::rd_kafka_t,
    topics: &[&str],
    timeout: Duration,
) -> Result<HashMap<String, Described>, String> {
    let names: Vec<CString> = topics
        .iter()
        .map(|t| CString::new(*t).map_err(|_| format!("topic name {t:?} holds a NUL byte")))
        .collect::<Result<_, _>>()?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: every pointer below is created here and destroyed once on every path; `names`
    // outlives the collection, which librdkafka copies when the request is made.
    unsafe {
        let collection =
            sys::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len());
        let queue = sys::rd_kafka_queue_new(rk);
        let options = sys::rd_kafka_AdminOptions_new(
            rk,
            sys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let mut errstr = [0 as c_char; 256];
        sys::rd_kafka_AdminOptions_set_request_timeout(
            options,
            millis,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        sys::rd_kafka_DescribeTopics(rk, collection, options, queue);
        sys::rd_kafka_AdminOptions_destroy(options);
        sys::rd_kafka_TopicCollection_destroy(collection);
        // The request's own timeout ends it first; the margin only bounds a lost answer.
        let event = sys::rd_kafka_queue_poll(queue, millis.saturating_add(1_000));
        let result = read_event(event);
        if !event.is_null() {
            sys::rd_kafka_event_destroy(event);
        }
        sys::rd_kafka_queue_destroy(queue);
        result
    }
}

/// The descriptions in `event` (null: no answer in time).
unsafe fn read_event(
    event: *mut sys::rd_kafka_event_t,
) -> Result<HashMap<String, Described>, String> {
    if event.is_null() {
        return Err("DescribeTopics got no answer in time".to_owned());
    }
    // SAFETY: `event` is a live event of the request; the strings and descriptions it holds
    // live as long as it, and are copied out before it is destroyed.
    unsafe {
        if sys::rd_kafka_event_error(event) != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            return Err(format!(
                "DescribeTopics: {}",
                text(sys::rd_kafka_event_error_string(event))
            ));
        }
        let result = sys::rd_kafka_event_DescribeTopics_result(event);
        if result.is_null() {
            return Err("DescribeTopics: not a DescribeTopics result".to_owned());
        }
        let mut count = 0usize;
        let descriptions = sys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        let mut out = HashMap::with_capacity(count);
        for i in 0..count {
            let d = *descriptions.add(i);
            let name = text(sys::rd_kafka_TopicDescription_name(d));
            let error = sys::rd_kafka_TopicDescription_error(d);
            let described = if !error.is_null()
                && sys::rd_kafka_error_code(error)
                    != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            {
                Described::Refused(text(sys::rd_kafka_error_string(error)))
            } else {
                let id = sys::rd_kafka_TopicDescription_topic_id(d);
                Described::Id(if id.is_null() {
                    None
                } else {
                    let high = sys::rd_kafka_Uuid_most_significant_bits(id) as u64;
                    let low = sys::rd_kafka_Uuid_least_significant_bits(id) as u64;
                    Some(Uuid::from_u64_pair(high, low)).filter(|u| !u.is_nil())
                })
            };
            out.insert(name, described);
        }
        Ok(out)
    }
}

/// A C string as text (lossy), empty for null.
unsafe fn text(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: librdkafka's strings are NUL-terminated and live as long as their event.
    unsafe { CStr::from_ptr(s).to_string_lossy().into_owned() }
}
