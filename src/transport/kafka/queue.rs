//! One partition's share of the consume loop: the messages waiting for a
//! batch, in offset order, and the batches of the partition in flight.
//!
//! A few batches of a partition may run at once, so the next one is
//! claimed while the previous ones' handlers run and their outcomes are
//! stored. A batch never holds a message whose identity a running batch of
//! the partition holds (by the engine's identity hint; a message without
//! one runs alone), and a message to retry goes back in offset order: one
//! key's messages are still decided one after the other, in order.

use super::ledger::Lane;
use super::message::Held;
use std::collections::{HashSet, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// Batches of one partition in flight at once: with two, the claims of one
/// overlap the finishes of the other; a third kept PostgreSQL busier still
/// (8% more messages a second at one partition here, 2 cores).
pub(super) const FLIGHTS: usize = 3;

pub(super) struct Queue {
    pub lane: Lane,
    pub waiting: VecDeque<Held>,
    flights: Vec<Flight>,
    /// Bytes of the waiting messages and of those in flight.
    pub bytes: usize,
    pub blocked_until: Option<Instant>,
    pub paused: bool,
    /// Last time a message of this partition got a durable outcome, or the
    /// partition had nothing to do.
    pub progress_at: Instant,
}

/// A batch's share of this partition.
struct Flight {
    id: u64,
    count: usize,
    bytes: usize,
    /// Identity hints of its messages; None: one of them has none, so no
    /// other batch of this partition may run beside it.
    hints: Option<HashSet<u64>>,
}

impl Queue {
    pub(super) fn new(lane: &Lane) -> Self {
        Self {
            lane: lane.clone(),
            waiting: VecDeque::new(),
            flights: Vec::new(),
            bytes: 0,
            blocked_until: None,
            paused: false,
            progress_at: Instant::now(),
        }
    }

    /// Messages waiting or in flight.
    pub(super) fn held(&self) -> usize {
        self.waiting.len() + self.flights.iter().map(|f| f.count).sum::<usize>()
    }

    /// Room for another batch, and messages waiting for one.
    pub(super) fn open(&self) -> bool {
        self.flights.len() < FLIGHTS && !self.waiting.is_empty()
    }

    /// Its head message can join a batch now.
    pub(super) fn ready(&self, now: Instant) -> bool {
        self.open()
            && self.blocked_until.is_none_or(|t| t <= now)
            && self.fits_beside(self.waiting.front().and_then(|h| h.hint))
    }

    /// Whether a message with `hint` may run beside the batches in flight.
    fn fits_beside(&self, hint: Option<u64>) -> bool {
        self.flights.iter().all(|f| match (&f.hints, hint) {
            (Some(hints), Some(h)) => !hints.contains(&h),
            _ => false,
        })
    }

    /// Moves up to `room` messages from the head into batch `id`, stopping
    /// at the first that may not run beside the batches in flight.
    pub(super) fn take(&mut self, id: u64, room: usize, into: &mut Vec<Held>) {
        let mut flight = Flight {
            id,
            count: 0,
            bytes: 0,
            hints: Some(HashSet::new()),
        };
        while flight.count < room {
            let Some(hint) = self.waiting.front().map(|h| h.hint) else {
                break;
            };
            if !self.fits_beside(hint) {
                break;
            }
            match (&mut flight.hints, hint) {
                (Some(hints), Some(h)) => {
                    hints.insert(h);
                }
                (hints, _) => *hints = None,
            }
            let held = self.waiting.pop_front().expect("a head was just seen");
            flight.count += 1;
            flight.bytes += held.size();
            into.push(held);
        }
        if flight.count > 0 {
            self.flights.push(flight);
            self.blocked_until = None;
        }
    }

    /// Batch `id` ended: `retries` go back in offset order and hold the
    /// partition for `after`. Returns the bytes it no longer holds.
    pub(super) fn land(&mut self, id: u64, retries: Vec<Held>, after: Duration) -> usize {
        let Some(at) = self.flights.iter().position(|f| f.id == id) else {
            return 0;
        };
        let flight = self.flights.remove(at);
        let now = Instant::now();
        if flight.count > retries.len() {
            self.progress_at = now;
        }
        let kept: usize = retries.iter().map(Held::size).sum();
        if !retries.is_empty() {
            self.blocked_until = Some(now + after);
        }
        for mut held in retries {
            held.incoming.retries = held.incoming.retries.saturating_add(1);
            let at = self.waiting.partition_point(|w| w.offset < held.offset);
            self.waiting.insert(at, held);
        }
        let freed = flight.bytes.saturating_sub(kept);
        self.bytes -= freed.min(self.bytes);
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Incoming, Source};
    use crate::transport::kafka::ledger::Tp;

    fn lane() -> Lane {
        Lane {
            tp: Tp {
                topic: "t".into(),
                partition: 0,
            },
            generation: 1,
        }
    }

    /// A record at `offset` whose identity hint is `hint`.
    fn held(offset: i64, hint: Option<u64>) -> Held {
        let source = Source::Kafka {
            topic: "t".into(),
            partition: 0,
            offset,
        };
        Held {
            lane: lane(),
            offset,
            key: None,
            hint,
            incoming: Incoming::new(source, vec![b'x'; 10]),
        }
    }

    fn queue(records: impl IntoIterator<Item = Held>) -> Queue {
        let mut q = Queue::new(&lane());
        for h in records {
            q.bytes += h.size();
            q.waiting.push_back(h);
        }
        q
    }

    fn offsets(batch: &[Held]) -> Vec<i64> {
        batch.iter().map(|h| h.offset).collect()
    }

    #[test]
    fn a_second_batch_stops_at_the_first_key_the_first_batch_holds() {
        let hints = [1, 2, 3, 4, 2, 5];
        let mut q = queue((0..6).map(|o| held(o, Some(hints[o as usize]))));
        let (mut first, mut second) = (Vec::new(), Vec::new());
        q.take(1, 2, &mut first);
        assert!(q.ready(Instant::now()));
        q.take(2, 10, &mut second);
        assert_eq!(offsets(&first), [0, 1]);
        assert_eq!(offsets(&second), [2, 3], "offset 4 repeats key 2");
        assert!(!q.ready(Instant::now()), "its head repeats a key in flight");
        q.land(1, Vec::new(), Duration::ZERO);
        let mut third = Vec::new();
        q.take(3, 10, &mut third);
        assert_eq!(offsets(&third), [4, 5]);
    }

    #[test]
    fn no_more_batches_of_a_partition_run_than_the_limit() {
        let mut q = queue((0..10).map(|o| held(o, Some(o as u64))));
        for id in 0..FLIGHTS as u64 {
            assert!(q.ready(Instant::now()));
            q.take(id, 1, &mut Vec::new());
        }
        assert!(!q.ready(Instant::now()));
        q.land(0, Vec::new(), Duration::ZERO);
        assert!(q.ready(Instant::now()));
    }

    #[test]
    fn a_message_without_a_hint_never_runs_beside_another_batch() {
        let mut q = queue([held(0, Some(1)), held(1, None), held(2, Some(3))]);
        let mut first = Vec::new();
        q.take(1, 1, &mut first);
        assert!(!q.ready(Instant::now()), "the head has no hint");
        q.land(1, Vec::new(), Duration::ZERO);
        let mut second = Vec::new();
        q.take(2, 10, &mut second);
        assert_eq!(offsets(&second), [1, 2]);
        assert!(!q.ready(Instant::now()));
        let mut none = Vec::new();
        q.waiting.push_back(held(3, Some(9)));
        q.take(3, 10, &mut none);
        assert!(
            none.is_empty(),
            "nothing runs beside a batch holding a message without a hint"
        );
    }

    #[test]
    fn retries_go_back_in_offset_order_whichever_batch_lands_first() {
        let mut q = queue((0..6).map(|o| held(o, Some(o as u64))));
        let (mut first, mut second) = (Vec::new(), Vec::new());
        q.take(1, 2, &mut first);
        q.take(2, 2, &mut second);
        let retried_later = second.remove(1);
        q.land(2, vec![retried_later], Duration::ZERO);
        let retried_first = first.remove(0);
        q.land(1, vec![retried_first], Duration::ZERO);
        let order: Vec<i64> = q.waiting.iter().map(|h| h.offset).collect();
        assert_eq!(order, [0, 3, 4, 5]);
        assert!(q.waiting.iter().take(2).all(|h| h.incoming.retries == 1));
        let left: usize = q.waiting.iter().map(Held::size).sum();
        assert_eq!(q.bytes, left, "landed batches release their bytes");
    }

    #[test]
    fn a_retry_holds_the_partition_for_its_wait() {
        let mut q = queue([held(0, Some(1)), held(1, Some(2))]);
        let mut batch = Vec::new();
        q.take(1, 1, &mut batch);
        let wait = Duration::from_secs(60);
        q.land(1, batch, wait);
        assert!(!q.ready(Instant::now()));
        assert!(q.ready(Instant::now() + wait));
    }
}
