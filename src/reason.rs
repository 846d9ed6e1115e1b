//! Why a message was not applied: the pipeline's own reasons, and the ones a handler names.
//!
//! Invariant: every reason has one stable text, stored in `dead_letters.reason` and used as the
//! `reason` label of the dead-letter metric. The pipeline's texts are fixed; a handler's
//! rejection reasons are short snake_case names of its choosing ([`Reason::rejected`]), so a
//! service refuses its business cases under its own names (the ledger's `insufficient_funds`).

use std::borrow::Cow;
use std::collections::BTreeMap;

/// Why a message was not applied. The text form ([`Reason::as_str`]) is what is stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Reason {
    /// No id header, a null one, or headers the client cannot parse.
    MissingId,
    /// The id is not a UUID, is the nil or max UUID, or comes in more than one header.
    InvalidId,
    /// The record has no value, or an empty one.
    EmptyPayload,
    /// The value is not the expected JSON, or has wrong types.
    InvalidPayload,
    /// The handler failed on this message alone for a reason retrying cannot fix (a poison
    /// message, isolated by bisecting its batch); `detail` holds the error.
    HandlerError,
    /// The id is a UUIDv7 older than the inbox retention: its inbox row may already be removed,
    /// so the message cannot be proven new and is not applied.
    OutsideDedupWindow,
    /// The handler refused the message for a business reason it names.
    Rejected(RejectReason),
}

/// A handler's name for a rejection: 1 to [`RejectReason::MAX_LEN`] characters of `a-z`, `0-9`
/// and `_`, starting with a letter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RejectReason(Cow<'static, str>);

/// A rejection name that is not snake_case or is too long.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a rejection reason is 1 to 64 characters of a-z, 0-9 and _, starting with a letter")]
pub struct InvalidReason;

impl RejectReason {
    /// Longest name.
    pub const MAX_LEN: usize = 64;

    /// A name fixed in the code. An invalid one is caught by the handler's tests: it fails the
    /// `debug_assert` here, and [`RejectReason::is_valid`] says so.
    pub const fn from_static(name: &'static str) -> Self {
        Self(Cow::Borrowed(name))
    }

    /// A name known only at run time (a SQL handler's result), checked.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidReason> {
        let name = name.into();
        if Self::valid(&name) {
            Ok(Self(Cow::Owned(name)))
        } else {
            Err(InvalidReason)
        }
    }

    /// True when the name follows the rules (for names made with [`RejectReason::from_static`]).
    pub fn is_valid(&self) -> bool {
        Self::valid(&self.0)
    }

    fn valid(name: &str) -> bool {
        let mut chars = name.chars();
        name.len() <= Self::MAX_LEN
            && chars.next().is_some_and(|c| c.is_ascii_lowercase())
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Reason {
    /// The pipeline's own reasons (every one but [`Reason::Rejected`]), in a fixed order.
    pub const PIPELINE: [Reason; 6] = [
        Reason::MissingId,
        Reason::InvalidId,
        Reason::EmptyPayload,
        Reason::InvalidPayload,
        Reason::HandlerError,
        Reason::OutsideDedupWindow,
    ];

    /// A handler's rejection named `name` (a constant: see [`RejectReason::from_static`]).
    pub const fn rejected(name: &'static str) -> Reason {
        Reason::Rejected(RejectReason::from_static(name))
    }

    /// The stable text stored in the database.
    pub fn as_str(&self) -> &str {
        match self {
            Reason::MissingId => "missing_id",
            Reason::InvalidId => "invalid_id",
            Reason::EmptyPayload => "empty_payload",
            Reason::InvalidPayload => "invalid_payload",
            Reason::HandlerError => "handler_error",
            Reason::OutsideDedupWindow => "outside_dedup_window",
            Reason::Rejected(name) => name.as_str(),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Dead letters of one transaction, counted by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasonCounts(BTreeMap<Reason, u64>);

impl ReasonCounts {
    /// Counts the reasons of `reasons`.
    pub fn of<'a>(reasons: impl IntoIterator<Item = &'a Reason>) -> Self {
        let mut counts = BTreeMap::new();
        for r in reasons {
            *counts.entry(r.clone()).or_default() += 1;
        }
        Self(counts)
    }

    /// Each reason that occurred, with its count.
    pub fn iter(&self) -> impl Iterator<Item = (&Reason, u64)> + '_ {
        self.0.iter().map(|(r, n)| (r, *n))
    }

    /// The count of `reason`.
    pub fn get(&self, reason: &Reason) -> u64 {
        self.0.get(reason).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pipeline_reason_has_its_own_text() {
        let names: std::collections::HashSet<_> =
            Reason::PIPELINE.iter().map(Reason::as_str).collect();
        assert_eq!(names.len(), Reason::PIPELINE.len());
        assert_eq!(
            Reason::rejected("insufficient_funds").as_str(),
            "insufficient_funds"
        );
    }

    #[test]
    fn a_handler_names_its_reasons_in_snake_case() {
        for ok in ["a", "invalid_path", "over_limit_2"] {
            assert!(RejectReason::new(ok).is_ok(), "{ok}");
        }
        let long = "x".repeat(65);
        for bad in [
            "",
            "Upper",
            "2start",
            "with space",
            "dash-ed",
            "nul\0",
            long.as_str(),
        ] {
            assert_eq!(RejectReason::new(bad), Err(InvalidReason), "{bad:?}");
        }
        assert!(RejectReason::from_static("fine").is_valid());
        assert!(!RejectReason::from_static("Not fine").is_valid());
    }

    #[test]
    fn counts_are_kept_per_reason() {
        let over = Reason::rejected("over");
        let reasons = [Reason::MissingId, over.clone(), Reason::MissingId];
        let counts = ReasonCounts::of(&reasons);
        assert_eq!((counts.get(&Reason::MissingId), counts.get(&over)), (2, 1));
        assert_eq!(counts.get(&Reason::InvalidId), 0);
        assert_eq!(counts.iter().count(), 2);
    }
}
