//! Secrets in settings: which settings hold one, and how each is hidden wherever settings are
//! shown (`--print-config`, `{:?}` of the configuration types, errors, logs, probes).
//!
//! Invariant: the password of the database URL, in every form tokio-postgres accepts, and the
//! value of every sensitive librdkafka property never leave the process in clear. The types that
//! hold them redact in `Debug` ([`DatabaseUrl`], [`RedactedProperties`]) and have no `Display`;
//! reading the clear value takes an explicit [`DatabaseUrl::expose`].

mod conninfo;

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

pub use conninfo::redact_database_url;

/// What a hidden value is replaced with.
pub const MASK: &str = "***";

/// The librdkafka properties that librdkafka itself marks sensitive (`_RK_SENSITIVE` in
/// `src/rdkafka_conf.c` of librdkafka 2.12, the version rdkafka-sys bundles), and
/// `sasl.oauthbearer.client.credentials.client.secret`, an alias of one of them. Their values are
/// never shown; `is_sensitive_property` adds a conservative rule for keys not listed here.
pub const LIBRDKAFKA_SENSITIVE: &[&str] = &[
    "ssl.key.location",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.ca.pem",
    "ssl.keystore.password",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
];

/// A key containing one of these (in any case) is treated as sensitive even when librdkafka does
/// not list it: a newer property, a misspelled one, or a connection parameter.
const SENSITIVE_WORDS: &[&str] = &[
    "password",
    "passphrase",
    "secret",
    "key.pem",
    "token",
    "credential",
];

/// True when `key` names a setting whose value must not be shown: a librdkafka property of
/// [`LIBRDKAFKA_SENSITIVE`], or any key containing `password`, `passphrase`, `secret`, `key.pem`,
/// `token` or `credential`.
pub(crate) fn is_sensitive_property(key: &str) -> bool {
    let key = key.trim();
    LIBRDKAFKA_SENSITIVE.contains(&key) || has_sensitive_word(key)
}

/// True when `key` contains one of the sensitive words, in any case.
pub(crate) fn has_sensitive_word(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SENSITIVE_WORDS.iter().any(|w| key.contains(w))
}

/// `value`, or [`MASK`] when `key` is sensitive.
pub(crate) fn redact_property<'a>(key: &str, value: &'a str) -> &'a str {
    if is_sensitive_property(key) {
        MASK
    } else {
        value
    }
}

/// A `KEY=VALUE` argument (`-X`) with its value hidden when the key is sensitive.
pub fn redact_property_arg(arg: &str) -> String {
    match arg.split_once('=') {
        Some((key, value)) => format!("{key}={}", redact_property(key, value)),
        None => arg.to_owned(),
    }
}

/// `text` with every occurrence of each non-empty `secret` replaced by [`MASK`]: the last line of
/// defence for text that comes from a library (a driver's or a client's error message).
pub(crate) fn scrub<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_owned();
    for secret in secrets {
        if !secret.is_empty() && out.contains(secret) {
            out = out.replace(secret, MASK);
        }
    }
    out
}

/// `Debug` of librdkafka properties with the values of sensitive ones hidden.
pub(crate) struct RedactedProperties<'a>(pub(crate) &'a [(String, String)]);

impl fmt::Debug for RedactedProperties<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, v)| (k, redact_property(k, v))))
            .finish()
    }
}

/// The values of the sensitive properties among `properties`, to [`scrub`] from library text.
pub(crate) fn sensitive_values(properties: &[(String, String)]) -> impl Iterator<Item = &str> {
    properties
        .iter()
        .filter(|(k, _)| is_sensitive_property(k))
        .map(|(_, v)| v.as_str())
}

/// A PostgreSQL connection string (URL or `key=value` form) that may hold a password. `Debug`
/// shows it with the password hidden; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// Wraps a connection string.
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The connection string in clear, for the driver only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The connection string with its password hidden, for showing.
    pub fn redacted(&self) -> String {
        redact_database_url(&self.0)
    }

    /// The password the driver would use, when the string parses and has one.
    pub fn password(&self) -> Option<String> {
        let config = tokio_postgres::Config::from_str(&self.0).ok()?;
        config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
    }

    /// `text` with this URL's password (when it has one) replaced by [`MASK`].
    pub fn scrub(&self, text: &str) -> String {
        scrub(text, self.password().as_deref())
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl")
            .field(&self.redacted())
            .finish()
    }
}

impl FromStr for DatabaseUrl {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn librdkafka_sensitive_properties_and_suspicious_keys_are_hidden() {
        for key in LIBRDKAFKA_SENSITIVE {
            assert_eq!(redact_property(key, "Sup3rS3cretPw"), MASK, "{key}");
        }
        for key in [
            "sasl.oauthbearer.client.secret",
            "sasl.pasword.secret",
            "my.api.token",
            "SASL.PASSWORD",
            "aws.credentials",
            "ssl.other.key.pem",
            " sasl.password ",
        ] {
            assert!(is_sensitive_property(key), "{key}");
        }
        for key in ["fetch.min.bytes", "bootstrap.servers", "ssl.ca.location"] {
            assert_eq!(redact_property(key, "1"), "1", "{key}");
        }
        assert_eq!(
            redact_property_arg("ssl.key.pem=-----BEGIN"),
            "ssl.key.pem=***"
        );
        assert_eq!(redact_property_arg("client.id=a=b"), "client.id=a=b");
    }

    #[test]
    fn debug_of_the_secret_holders_hides_the_secret() {
        let url = DatabaseUrl::new("postgres://app:Sup3rS3cretPw@db/x");
        let shown = format!("{url:?}");
        assert_eq!(shown, "DatabaseUrl(\"postgres://app:***@db/x\")");
        assert_eq!(url.expose(), "postgres://app:Sup3rS3cretPw@db/x");
        let props = vec![
            ("sasl.password".to_owned(), "Sup3rS3cretPw".to_owned()),
            ("client.id".to_owned(), "app".to_owned()),
        ];
        let shown = format!("{:?}", RedactedProperties(&props));
        assert_eq!(shown, r#"[("sasl.password", "***"), ("client.id", "app")]"#);
    }

    #[test]
    fn scrubbing_replaces_every_occurrence_of_the_password() {
        let url = DatabaseUrl::new("host=db user=app password='Sup3r S3cret'");
        assert_eq!(url.password().as_deref(), Some("Sup3r S3cret"));
        assert_eq!(
            url.scrub("a Sup3r S3cret b Sup3r S3cret"),
            format!("a {MASK} b {MASK}")
        );
        assert_eq!(DatabaseUrl::new("postgres://db/x").scrub("text"), "text");
        let props = [("sasl.password".to_owned(), "pw1".to_owned())];
        assert_eq!(scrub("x pw1 y", sensitive_values(&props)), "x *** y");
    }
}
