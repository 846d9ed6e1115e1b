//! A handler that panics is a bug, not a poison message: the processor stops with an error
//! naming the partition instead of hanging, and nothing of the failed batch is applied.

use crate::common;
use std::sync::Arc;

use batch_inbox::ledger::Entry;
use batch_inbox::Message;
use batch_inbox::{Handler, Mode, Rejection, Transaction};
use batch_inbox::{HandlerError, RunError};
use batch_inbox_tools::generate::GeneratorSettings;
use common::scenario::Scenario;
use common::*;

struct Panics;

impl Handler for Panics {
    type Payload = Entry;

    async fn handle(
        &self,
        _tx: &Transaction<'_>,
        _messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        panic!("handler bug")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_stops_the_processor_with_an_error() {
    let world = Scenario::new("panic")
        .mock()
        .generated(GeneratorSettings {
            messages: 100,
            accounts: 10,
            ..GeneratorSettings::default()
        })
        .build()
        .await;
    let (pool, kafka) = (world.pool.clone(), world.kafka());
    let cfg = config(kafka.settings("g"), Mode::Batched, 50);
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        batch_inbox::run(cfg, pool.clone(), Arc::new(Panics), std::future::pending()),
    )
    .await
    .expect("the processor stops instead of hanging");
    match result {
        Err(RunError::WorkerPanic {
            partition, message, ..
        }) => assert_eq!((partition, message.as_str()), (0, "handler bug")),
        other => panic!("expected a worker panic, got {:?}", other.map(|_| ())),
    }
    let t = tables(&pool).await;
    assert_eq!(
        (t.inbox.len(), t.balances.len(), t.dead_letters.len()),
        (0, 0, 0),
        "the panicking batch rolled back"
    );
}
