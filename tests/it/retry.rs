//! A transaction whose connection dies is retried on a new connection: nothing is lost, nothing
//! is applied twice, and no offset moves past the failed batch before it commits.

use crate::common;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use batch_inbox::ledger::{Entry, Ledger};
use batch_inbox::HandlerError;
use batch_inbox::Message;
use batch_inbox::{Handler, Mode, Rejection, Transaction};
use batch_inbox_tools::generate::GeneratorSettings;
use common::scenario::Scenario;
use common::*;

/// The ledger, except that its 2nd and 5th calls kill their own database session mid-transaction.
struct Flaky {
    calls: AtomicU32,
}

impl Handler for Flaky {
    type Payload = Entry;

    async fn handle(
        &self,
        tx: &Transaction<'_>,
        messages: &[Message<Entry>],
    ) -> Result<Vec<Rejection>, HandlerError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call == 2 || call == 5 {
            tx.execute("SELECT pg_terminate_backend(pg_backend_pid())", &[])
                .await?;
        }
        Ledger.handle(tx, messages).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_mid_batch_is_retried_without_loss_or_double_effect() {
    let world = Scenario::new("retry")
        .mock()
        .generated(GeneratorSettings {
            messages: 2_000,
            accounts: 40,
            ..GeneratorSettings::default()
        })
        .build()
        .await;
    let (pool, kafka) = (world.pool.clone(), world.kafka());
    let handler = Arc::new(Flaky {
        calls: AtomicU32::new(0),
    });
    let cfg = config(kafka.settings("g"), Mode::Batched, 200);
    let stats = batch_inbox::run(cfg, pool.clone(), handler.clone(), std::future::pending())
        .await
        .expect("transient failures do not stop the processor")
        .snapshot();

    assert_eq!(stats.retries, 2, "two attempts failed and were retried");
    assert_eq!(
        stats.records, 2_000,
        "each record counted once: failed attempts count nothing"
    );
    world.assert_exact().await;
}
