//! Members join and leave while batches are in flight (slow transactions), with the eager and
//! the cooperative protocol: a revoke waits for the partition's batch, so no member ever stores
//! an offset for a partition it no longer owns, committed offsets never go backwards, and every
//! message is applied once. The join's revoke is made to arrive while the first member holds a
//! batch open on every partition.

use crate::common;
use crate::common::group;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use batch_inbox::ledger::{Entry, Ledger};
use batch_inbox::HandlerError;
use batch_inbox::Message;
use batch_inbox::{Handler, Mode, Rejection, Transaction};
use batch_inbox_tools::generate::{Generator, GeneratorSettings, Model, Record};
use batch_inbox_tools::verify::{differences, observe};
use common::*;
use group::*;

/// The ledger, 30 ms slower per batch: rebalances land while batches are in flight. With a
/// gate, while it is closed, each batch also waits in the handler after its work, its
/// transaction open, until the gate opens.
struct SlowLedger {
    gate: Option<Gate>,
}

/// Holds batches in flight until opened.
struct Gate {
    open: tokio::sync::watch::Sender<bool>,
    /// Batches waiting at the gate now.
    waiting: AtomicU64,
}

impl Handler for SlowLedger {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        tx.batch_execute("SELECT pg_sleep(0.03)").await?;
        let rejected = Ledger.handle(tx, messages).await?;
        if let Some(gate) = &self.gate {
            let mut open = gate.open.subscribe();
            if !*open.borrow_and_update() {
                gate.waiting.fetch_add(1, SeqCst);
                let _ = open.wait_for(|open| *open).await;
                gate.waiting.fetch_sub(1, SeqCst);
            }
        }
        Ok(rejected)
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

/// `revoked_at_join`: the partitions (of 4) the first member gives up when the second joins.
async fn join_and_leave_mid_batch(name: &str, strategy: &str, revoked_at_join: u64) {
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
    // The first member's gate is closed: each of its partition workers holds its first batch
    // open in the handler, so every partition has a batch in flight.
    let gated = Arc::new(SlowLedger {
        gate: Some(Gate {
            open: tokio::sync::watch::Sender::new(false),
            waiting: AtomicU64::new(0),
        }),
    });
    let gate = gated.gate.as_ref().unwrap();
    let first = Member::start_with(cfg(), &pool, gated.clone());
    let a = first.stats.clone();
    wait_for(
        "a batch in flight on each partition of the first member",
        60,
        || async { gate.waiting.load(SeqCst) == 4 },
    )
    .await;
    // A second member joins. The revoke reaches the first member while all its batches are
    // held: it must wait for them, and the second member gets none of its partitions meanwhile.
    let second = Member::start_with(cfg(), &pool, Arc::new(SlowLedger { gate: None }));
    let b = second.stats.clone();
    wait_for("the revoke to reach the first member", 60, || async {
        a.partitions_revoked() > 0
    })
    .await;
    assert_eq!(a.partitions_revoked(), revoked_at_join);
    assert_eq!(gate.waiting.load(SeqCst), 4, "the batches still in flight");
    assert_eq!(
        a.snapshot().records,
        0,
        "nothing committed before the revoke"
    );
    assert_eq!(
        b.assigned_partitions(),
        0,
        "a partition whose batch is in flight stays with its owner"
    );
    gate.open.send_replace(true);
    // Traffic keeps flowing until the second member owns partitions and has applied something.
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
    join_and_leave_mid_batch("mid_batch_coop", "cooperative-sticky", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_members_joining_and_leaving_mid_batch_apply_each_message_once() {
    join_and_leave_mid_batch("mid_batch_eager", "range", 4).await;
}
