//! Members join and leave while batches are in flight (slow transactions), with the eager and
//! the cooperative protocol: a revoke waits for the partition's batch, so no member ever stores
//! an offset for a partition it no longer owns, committed offsets never go backwards, and every
//! message is applied once.

use crate::common;
use crate::common::group;
use std::sync::Arc;

use batch_inbox::ledger::{Entry, Ledger};
use batch_inbox::message::Message;
use batch_inbox::HandlerError;
use batch_inbox::{Handler, Mode, Rejection, Transaction};
use batch_inbox_tools::generate::{Generator, GeneratorSettings, Model, Record};
use batch_inbox_tools::verify::{differences, observe};
use common::*;
use group::*;

/// The ledger, 30 ms slower per batch: rebalances land while batches are in flight.
struct SlowLedger;

impl Handler for SlowLedger {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        tx.batch_execute("SELECT pg_sleep(0.03)").await?;
        Ledger.handle(tx, messages).await
    }
}

struct Feed {
    input: Generator,
    model: Model,
}

impl Feed {
    fn next(&mut self, n: usize) -> Vec<Record> {
        let model = &mut self.model;
        self.input
            .by_ref()
            .take(n)
            .inspect(|r| model.apply(r))
            .collect()
    }
}

async fn join_and_leave_mid_batch(name: &str, strategy: &str) {
    let (_, pool) = fresh_db(name).await;
    let kafka = Kafka::new(name, 4);
    let mut feed = Feed {
        input: Generator::new(GeneratorSettings {
            messages: u64::MAX,
            accounts: 100,
            seed: 21,
            ..GeneratorSettings::default()
        }),
        model: Model::default(),
    };
    let sampler = CommittedSampler::start(OffsetReader::new(&kafka.brokers, "g", name, 4));
    let cfg = || {
        let mut settings = kafka.settings("g");
        let strategy = (
            "partition.assignment.strategy".to_owned(),
            strategy.to_owned(),
        );
        settings.overrides.push(strategy);
        let mut c = config(settings, Mode::Batched, 50);
        c.exit_on_eof = false;
        c
    };

    kafka.send_generated(feed.next(1_500)).await;
    let first = Member::start_with(cfg(), &pool, Arc::new(SlowLedger));
    let a = first.stats.clone();
    wait_for("the first member at work", 60, || async {
        a.snapshot().records >= 300
    })
    .await;
    // A second member joins while the first is mid-backlog; traffic keeps flowing until it
    // owns partitions and has applied something.
    let second = Member::start_with(cfg(), &pool, Arc::new(SlowLedger));
    let b = second.stats.clone();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while b.snapshot().transactions < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second member got nothing"
        );
        kafka.send_generated(feed.next(100)).await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // It leaves with batches in flight: its partitions go back to the first member.
    kafka.send_generated(feed.next(1_000)).await;
    second.stop().await;
    kafka.send_generated(feed.next(500)).await;
    let expected = feed.model.expected().clone();
    wait_for("every valid id applied", 120, || async {
        inbox_rows(&pool).await == expected.new
    })
    .await;
    let reader = OffsetReader::new(&kafka.brokers, "g", name, 4);
    let ends = reader.ends();
    wait_for("lag 0", 60, || async {
        reader.committed() == Some(ends.clone())
    })
    .await;
    first.stop().await;

    let (a, b) = (a.snapshot(), b.snapshot());
    assert_eq!(a.new + b.new, expected.new, "each id applied by one member");
    assert_eq!(
        (a.offsets_refused, b.offsets_refused),
        (0, 0),
        "no offset stored for a partition a member no longer owned"
    );
    let observed = observe(&**pool.get().await.unwrap()).await.unwrap();
    assert_eq!(differences(&observed, &expected), Vec::<String>::new());
    assert_eq!(db_offsets(&pool, "g", 4).await, ends);
    sampler.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_members_joining_and_leaving_mid_batch_apply_each_message_once() {
    join_and_leave_mid_batch("mid_batch_coop", "cooperative-sticky").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_members_joining_and_leaving_mid_batch_apply_each_message_once() {
    join_and_leave_mid_batch("mid_batch_eager", "range").await;
}
