//! The next offset to commit for one partition.
//!
//! Invariant: the position only moves forward, and only to the offset after a message whose batch
//! has committed in the database. Batches of a partition commit one after another, so the highest
//! committed offset is also the highest contiguous one.

/// Committed position of one partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OffsetTracker {
    next: Option<i64>,
}

impl OffsetTracker {
    /// Records that every message up to and including `last_offset` is committed in the
    /// database. Returns the new next offset to store when the position moved forward, `None`
    /// when it would not (a replayed or older batch).
    pub(crate) fn committed_through(&mut self, last_offset: i64) -> Option<i64> {
        let next = last_offset.checked_add(1)?;
        if self.next.is_some_and(|current| next <= current) {
            return None;
        }
        self.next = Some(next);
        Some(next)
    }

    /// The next offset to consume, once anything has committed.
    #[cfg(test)]
    fn next(&self) -> Option<i64> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_forward_only() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.next(), None);
        assert_eq!(t.committed_through(9), Some(10));
        assert_eq!(t.committed_through(4), None);
        assert_eq!(t.committed_through(9), None);
        assert_eq!(t.committed_through(10), Some(11));
        assert_eq!(t.next(), Some(11));
        assert_eq!(t.committed_through(i64::MAX), None);
    }
}
