use super::*;

#[test]
fn the_url_s_password_or_token_is_never_shown() {
    let url = NatsUrl::new("nats://app:S3cr%2Ft@127.0.0.1:4333");
    assert_eq!(
        format!("{url:?}"),
        "NatsUrl(\"nats://app:***@127.0.0.1:4333\")"
    );
    assert_eq!(url.address(), "127.0.0.1:4333");
    assert_eq!(
        url.credentials(),
        Some(("app".to_owned(), Some("S3cr/t".to_owned())))
    );
    assert_eq!(url.scrub("refused S3cr/t"), "refused ***");
    let token = NatsUrl::new("nats://t0ken@host");
    assert_eq!(token.redacted(), "nats://***@host");
    assert_eq!(token.address(), "host:4222");
    assert_eq!(token.scrub("bad t0ken"), "bad ***");
    let plain = NatsUrl::new("nats://[::1]:4222");
    assert_eq!(plain.redacted(), "nats://[::1]:4222");
    assert_eq!(plain.address(), "[::1]:4222");
    assert_eq!(NatsUrl::new("nats://[::1]").address(), "[::1]:4222");
    assert!(NatsUrl::is_nats("NATS://h") && NatsUrl::is_nats("tls://h"));
    assert!(!NatsUrl::is_nats("amqp://h"));
    assert!(NatsUrl::new("tls://h").tls());
    // A password holding '/', '?', '@' unencoded, a token that is also the scheme's name, a
    // list of servers: nothing of them shown.
    let slash = NatsUrl::new("nats://app:pa/ss?x@y@127.0.0.1:4333");
    assert_eq!(slash.redacted(), "nats://app:***@127.0.0.1:4333");
    assert_eq!(slash.address(), "127.0.0.1:4333");
    assert_eq!(
        slash.credentials(),
        Some(("app".to_owned(), Some("pa/ss?x@y".to_owned())))
    );
    assert_eq!(
        NatsUrl::new("nats://nats@host").redacted(),
        "nats://***@host"
    );
    assert_eq!(
        NatsUrl::new("nats://app:s3cret@h1:4222,nats://app:s3cret@h2:4222").redacted(),
        "nats://app:***@h1:4222,nats://app:***@h2:4222"
    );
}

#[test]
fn names_a_subject_cannot_carry_are_refused() {
    assert!(check_name("stream", "ORDERS_1-a").is_ok());
    for bad in ["", "a.b", "a*", "a>", "a b", "a\0", "a/b"] {
        assert!(check_name("stream", bad).is_err(), "{bad:?}");
    }
    assert!(check_name("stream", &"s".repeat(256)).is_err());
}

fn settings() -> NatsSettings {
    NatsSettings::new(NatsUrl::new("nats://h"), vec!["S".to_owned()], "C")
}

#[test]
fn a_consumer_that_breaks_the_guarantee_is_refused() {
    let s = settings();
    let good = s.consumer_config(None);
    assert!(s.check_consumer(&good).is_ok());
    assert_eq!(good.ack_policy, "all");
    assert_eq!(good.max_deliver, -1);
    assert_eq!(good.max_ack_pending, 2000);
    let refused = |f: &dyn Fn(&mut ConsumerConfig)| {
        let mut c = good.clone();
        f(&mut c);
        s.check_consumer(&c).unwrap_err().to_string()
    };
    assert!(refused(&|c| c.ack_policy = "none".to_owned()).contains("ack_policy"));
    assert!(refused(&|c| c.deliver_subject = Some("push.x".to_owned())).contains("push"));
    assert!(refused(&|c| c.max_deliver = 5).contains("max_deliver"));
    assert!(refused(&|c| c.max_ack_pending = 10).contains("max_ack_pending"));
    assert!(refused(&|c| c.ack_wait = 100_000_000).contains("ack_wait"));
    assert!(refused(&|c| c.max_ack_pending = -1).contains("unlimited"));
    let pull_limit = |key: &str, value: i64| {
        refused(&|c| {
            c.other.insert(key.to_owned(), value.into());
        })
    };
    assert!(pull_limit("max_batch", 10).contains("max_batch"));
    assert!(pull_limit("max_expires", 1_000_000_000).contains("max_expires"));
    assert!(pull_limit("max_bytes", 1 << 20).contains("max_bytes"));
    let mut explicit = good.clone();
    explicit.ack_policy = "explicit".to_owned();
    explicit.max_ack_pending = 5000;
    explicit.other.insert("max_batch".to_owned(), 1000.into());
    assert!(s.check_consumer(&explicit).is_ok());
}

#[test]
fn settings_without_positions_in_the_database_or_with_a_short_ack_wait_are_refused() {
    let mut s = settings();
    assert!(s.check(true).is_ok());
    s.streams.push("a.b".to_owned());
    assert!(s.check(true).is_err());
    s.streams.clear();
    assert!(s.check(true).is_err());
    s.streams.push("S".to_owned());
    assert!(s.check(false).is_err());
    s.ack_wait = Duration::from_millis(500);
    assert!(s.check(true).is_err());
}

#[test]
fn the_lock_is_the_stream_s_and_the_consumer_s() {
    assert_eq!(lock_key("S", "C"), lock_key("S", "C"));
    assert_ne!(lock_key("S", "C"), lock_key("S", "D"));
    assert_ne!(lock_key("S", "C"), lock_key("T", "C"));
}
