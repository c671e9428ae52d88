//! `dedupq dlq list|replay`: dead letters of the Kafka DLQ topics and the
//! RabbitMQ dead-letter queue, read with the clients of `crate::broker`
//! (so with the TLS, SASL and timeouts of `dedupq run`).

mod amqp;
mod args;
mod kafka;
mod record;

pub use args::DlqCommand;
pub(super) use args::Transport;
pub(super) use record::DeadLetter;

use crate::cli::output::{self, Format};
use crate::config::Settings;
use record::Filter;
use std::io::Write;

#[derive(Debug, thiserror::Error)]
pub(super) enum DlqError {
    #[error("Kafka")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("RabbitMQ")]
    Amqp(#[from] crate::broker::amqp::raw::RawAmqpError),
    #[error("dead-letter topic {0} does not exist")]
    NoTopic(String),
    #[error("dead-letter queue {0} does not exist")]
    NoQueue(String),
    #[error("no Kafka topic: give --topic or set kafka.topics")]
    NoTopics,
    #[error("reading the dead-letter topic failed: {0}")]
    Reader(String),
}

/// Runs one `dlq` subcommand, writing the dead letters (and, for replay,
/// what was or would be done with each) to `out`.
pub async fn run_dlq(
    settings: &Settings,
    command: DlqCommand,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let (args, replay, execute) = match command {
        DlqCommand::List(args) => (args, false, false),
        DlqCommand::Replay { args, execute } => (args, true, execute),
    };
    let filter = Filter::from_args(&args);
    let identity = record::IdentityHeaders::from_settings(&settings.identity);
    let format = Format::choose(args.output.output);
    let letters = match args.transport {
        Transport::Kafka => {
            let topics = if args.topics.is_empty() {
                settings.kafka.topics.clone()
            } else {
                args.topics.clone()
            };
            if topics.is_empty() {
                return Err(DlqError::NoTopics.into());
            }
            let mut letters =
                kafka::read(&settings.kafka, topics, identity, filter, args.limit).await?;
            if replay {
                kafka::skip_repeats(&mut letters);
            }
            match (replay, execute) {
                (true, true) => kafka::replay(&settings.kafka, &mut letters).await?,
                (true, false) => kafka::plan(&mut letters),
                _ => {}
            }
            letters.into_iter().map(|l| l.letter).collect::<Vec<_>>()
        }
        Transport::Amqp => {
            let queue = args
                .queue
                .clone()
                .unwrap_or_else(|| settings.amqp.dead_letter_queue.clone());
            let mut session = amqp::Session::open(&settings.amqp, identity).await?;
            let result =
                amqp_letters(&mut session, &queue, &filter, args.limit, replay, execute).await;
            session.close().await;
            result?
        }
    };
    output::print(format, &letters, out)?;
    if replay && !execute {
        writeln!(
            std::io::stderr(),
            "dry run: {} dead letters would be replayed; add --execute to publish them",
            letters
                .iter()
                .filter(|l| l
                    .replay
                    .as_deref()
                    .is_some_and(|r| r.starts_with("would replay")))
                .count()
        )?;
    }
    Ok(())
}

async fn amqp_letters(
    session: &mut amqp::Session,
    queue: &str,
    filter: &Filter,
    limit: usize,
    replay: bool,
    execute: bool,
) -> Result<Vec<DeadLetter>, DlqError> {
    let mut letters = session.read(queue, filter, limit).await?;
    if replay && execute {
        session.replay(&mut letters).await?;
    } else if replay {
        amqp::dry_run(&mut letters);
    }
    Ok(letters.into_iter().map(|l| l.letter).collect())
}
