//! TEST-ONLY, UNSAFE: switches that break the guarantee on purpose, so that the fault tests and
//! the chaos run's control can show that their checks catch a broken processor.
//!
//! Invariant: only a build with the `unsafe-controls` feature can turn them on (the flags
//! `--unsafe-offsets-before-commit` and `--unsafe-no-inbox` exist only there, and so does
//! [`UnsafeControls::new`]); every other build carries the type with both switches off, the
//! branches they guard compile to nothing, and `batch_inbox_unsafe_mode` is always 0. A run with a
//! switch on says so at start, on every summary line and in that metric.

/// The unsafe switches of a processor; [`Default`] is both off, the only value a normal build
/// can make.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnsafeControls {
    offsets_before_commit: bool,
    no_inbox: bool,
}

impl UnsafeControls {
    /// `offsets_before_commit`: store a batch's offsets before its transaction runs (the classic
    /// at-most-once bug), so a crash or failure loses the batch. `no_inbox`: skip the dedup
    /// statement and write no inbox rows, so redeliveries are applied twice.
    #[cfg(feature = "unsafe-controls")]
    pub fn new(offsets_before_commit: bool, no_inbox: bool) -> Self {
        Self {
            offsets_before_commit,
            no_inbox,
        }
    }

    /// Offsets are stored before the database commit.
    pub fn offsets_before_commit(&self) -> bool {
        cfg!(feature = "unsafe-controls") && self.offsets_before_commit
    }

    /// No dedup and no inbox rows.
    pub fn no_inbox(&self) -> bool {
        cfg!(feature = "unsafe-controls") && self.no_inbox
    }

    /// The switches that are on, by flag name.
    pub fn switches(&self) -> Vec<&'static str> {
        [
            (
                self.offsets_before_commit(),
                "--unsafe-offsets-before-commit",
            ),
            (self.no_inbox(), "--unsafe-no-inbox"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }

    /// Says loudly, once, what each switch that is on breaks.
    pub fn warn(&self) {
        if self.offsets_before_commit() {
            tracing::warn!(
                "UNSAFE: --unsafe-offsets-before-commit is set: offsets are stored BEFORE the \
                 database commit, so crashes and failures LOSE messages. Test-only control; never \
                 use it in production."
            );
        }
        if self.no_inbox() {
            tracing::warn!(
                "UNSAFE: --unsafe-no-inbox is set: no deduplication, redelivered messages are \
                 APPLIED TWICE. Test-only control; never use it in production."
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_safe() {
        let off = UnsafeControls::default();
        assert!(!off.offsets_before_commit() && !off.no_inbox());
        assert!(off.switches().is_empty());
    }

    #[cfg(feature = "unsafe-controls")]
    #[test]
    fn each_switch_is_named() {
        let on = UnsafeControls::new(true, true);
        assert_eq!(
            on.switches(),
            ["--unsafe-offsets-before-commit", "--unsafe-no-inbox"]
        );
    }
}
