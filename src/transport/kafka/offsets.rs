//! Per partition: which received offsets still lack a durable outcome, and
//! so how far the committed offset may advance. It only ever advances over
//! a contiguous prefix of durable outcomes.

use std::collections::BTreeSet;

#[derive(Debug, Default, Clone)]
pub(super) struct OffsetTracker {
    /// Received, outcome not durable yet.
    pending: BTreeSet<i64>,
    /// One past the highest offset received.
    next: Option<i64>,
}

impl OffsetTracker {
    /// Registers a fetched message. False when the offset was seen before
    /// (librdkafka refetches after a pause): the caller drops that copy.
    pub(super) fn received(&mut self, offset: i64) -> bool {
        if self.next.is_some_and(|next| offset < next) {
            return false;
        }
        self.pending.insert(offset);
        self.next = Some(offset + 1);
        true
    }

    /// The message at `offset` has a durable outcome.
    pub(super) fn done(&mut self, offset: i64) {
        self.pending.remove(&offset);
    }

    /// The offset to commit: the first one without a durable outcome, or
    /// one past everything received. None before the first message.
    pub(super) fn position(&self) -> Option<i64> {
        self.pending.first().copied().or(self.next)
    }

    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::OffsetTracker;

    #[test]
    fn nothing_received_means_nothing_to_commit() {
        assert_eq!(OffsetTracker::default().position(), None);
    }

    #[test]
    fn the_position_stops_at_the_first_message_without_an_outcome() {
        let mut t = OffsetTracker::default();
        for o in 10..15 {
            assert!(t.received(o));
        }
        t.done(10);
        t.done(12);
        t.done(13);
        assert_eq!(t.position(), Some(11));
        t.done(14);
        assert_eq!(t.position(), Some(11));
        t.done(11);
        assert_eq!(t.position(), Some(15));
    }

    #[test]
    fn gaps_in_offsets_do_not_hold_the_position_back() {
        let mut t = OffsetTracker::default();
        assert!(t.received(3));
        assert!(t.received(7));
        t.done(3);
        assert_eq!(t.position(), Some(7));
        t.done(7);
        assert_eq!(t.position(), Some(8));
    }

    #[test]
    fn a_refetched_offset_is_refused() {
        let mut t = OffsetTracker::default();
        assert!(t.received(5));
        t.done(5);
        assert!(!t.received(5));
        assert!(!t.received(4));
        assert_eq!(t.position(), Some(6));
        assert!(t.received(6));
    }
}
