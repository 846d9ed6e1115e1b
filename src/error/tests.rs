use super::*;
use crate::fault::{classify_state, is_retryable_state};

#[test]
fn a_kafka_client_error_names_the_property_never_its_value() {
    let pw = "Sup3rS3cretPw";
    let refused = KafkaError::ClientConfig(
        RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
        format!("Invalid value \"{pw}\" for configuration property \"fetch.min.bytes\""),
        "fetch.min.bytes".to_owned(),
        pw.to_owned(),
    );
    let e = KafkaClientError::new(refused, &[]);
    assert_eq!(
        e.to_string(),
        "librdkafka property `fetch.min.bytes`: invalid value (its value is not shown)"
    );
    assert!(!format!("{e:?}").contains(pw));
    let unknown = KafkaError::ClientConfig(
        RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
        "No such configuration property: \"sasl.pasword\"".to_owned(),
        "sasl.pasword".to_owned(),
        pw.to_owned(),
    );
    let e = KafkaClientError::new(unknown, &[]);
    assert!(
        e.to_string().contains("`sasl.pasword`: no such property"),
        "{e}"
    );
    let creation = KafkaError::ClientCreation(format!("ssl.key.pem failed: {pw}"));
    let props = [("ssl.key.pem".to_owned(), pw.to_owned())];
    let e = KafkaClientError::new(creation, &props);
    assert!(e.to_string().ends_with("ssl.key.pem failed: ***"), "{e}");
}

#[test]
fn transient_states_are_retryable_and_constraint_violations_are_not() {
    for code in [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::ADMIN_SHUTDOWN,
        SqlState::CANNOT_CONNECT_NOW,
        SqlState::CONNECTION_FAILURE,
        SqlState::TOO_MANY_CONNECTIONS,
    ] {
        assert!(is_retryable_state(&code), "{code:?}");
    }
    for code in [
        SqlState::UNIQUE_VIOLATION,
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        SqlState::UNDEFINED_TABLE,
        SqlState::SYNTAX_ERROR,
    ] {
        assert!(!is_retryable_state(&code), "{code:?}");
    }
}

#[test]
fn every_failure_has_one_owner_the_transient_the_message_or_the_environment() {
    let owner = |code: &str| classify_state(&SqlState::from_code(code));
    // Transient: connection, rollback, resources, operator intervention, lock not available.
    for code in [
        "08006", "40001", "40P01", "53300", "57P01", "57P03", "55P03",
    ] {
        assert_eq!(owner(code), Fault::Transient, "{code}");
    }
    // The message's: the failure depends on the batch's data.
    for code in [
        "21000", "22003", "22P02", "22021", "23505", "23514", "23503", "44000", "54000", "P0001",
        "P0002", "P0003", "P0004",
    ] {
        assert_eq!(owner(code), Fault::Message, "{code}");
    }
    // The environment's: schema, grants, plans, read-only, system; unknown classes too.
    for code in [
        "42P01", "42703", "42501", "42883", "0A000", "25006", "2BP01", "3D000", "3F000", "58030",
        "F0000", "XX000", "57P04", "ZZ999", "HV000",
    ] {
        assert_eq!(owner(code), Fault::Environment, "{code}");
    }
}

#[test]
fn a_handler_error_is_the_message_s_fault_only_when_it_says_so() {
    let boxed = || -> Box<dyn std::error::Error + Send + Sync> { "x".into() };
    assert_eq!(HandlerError::Message(boxed()).fault(), Fault::Message);
    assert_eq!(
        HandlerError::Environment(boxed()).fault(),
        Fault::Environment
    );
    assert_eq!(HandlerError::Other(boxed()).fault(), Fault::Environment);
    assert!(!HandlerError::Other(boxed()).is_retryable());
}

/// A wrapper that says its cause, and the cause itself.
#[derive(Debug, thiserror::Error)]
#[error("cannot do it: {source}")]
struct Says {
    source: std::io::Error,
}

/// A wrapper that does not say its cause.
#[derive(Debug, thiserror::Error)]
#[error("step failed")]
struct Silent {
    #[source]
    source: Says,
}

#[test]
fn an_error_chain_says_each_cause_once_on_one_line() {
    let io = std::io::Error::other("disk\nfull");
    let silent = Silent {
        source: Says { source: io },
    };
    assert_eq!(chain(&silent), "step failed: cannot do it: disk full");
    assert_eq!(one_line_error(&silent), chain(&silent));
}
