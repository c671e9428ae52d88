//! Collecting a batch from the prefetch window: wait for one delivery, then
//! take whatever else arrives within the linger, up to the window size.

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::Consumer;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(super) enum Next {
    Batch(Vec<Delivery>),
    /// Asked to stop; nothing was taken.
    Stopped,
    /// The consumer was cancelled or its channel closed. Deliveries taken
    /// in this call are dropped unacked; the broker redelivers them.
    Ended(Option<lapin::Error>),
}

pub(super) async fn next_batch(
    consumer: &mut Consumer,
    max: usize,
    linger: Duration,
    stop: &CancellationToken,
) -> Next {
    let first = tokio::select! {
        biased;
        _ = stop.cancelled() => return Next::Stopped,
        next = consumer.next() => next,
    };
    let mut batch = match first {
        Some(Ok(delivery)) => vec![delivery],
        Some(Err(e)) => return Next::Ended(Some(e)),
        None => return Next::Ended(None),
    };
    let deadline = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        let next = tokio::select! {
            biased;
            next = consumer.next() => next,
            _ = tokio::time::sleep_until(deadline) => break,
        };
        match next {
            Some(Ok(delivery)) => batch.push(delivery),
            Some(Err(e)) => return Next::Ended(Some(e)),
            None => return Next::Ended(None),
        }
    }
    Next::Batch(batch)
}
