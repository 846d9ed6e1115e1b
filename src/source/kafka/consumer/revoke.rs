//! The wait of a revoke: the rebalance callback is synchronous, and the partitions it takes away
//! must finish (or abandon) their in-flight batches before another member may own them.
//!
//! Invariant: a revoke holds the rebalance for at most its timeout, however many partitions it
//! takes; a worker still running then is aborted (its uncommitted records are redelivered to the
//! next owner, and the inbox skips what it had applied).

use std::time::Duration;

use super::WorkerHandle;

/// Waits, without an async context, for revoked workers (the rebalance callback is synchronous).
pub(super) fn wait_for_workers(workers: Vec<WorkerHandle>, timeout: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        // Blocking a current-thread runtime would deadlock: the workers could not run.
        tracing::warn!("revoke does not wait for workers on a current-thread runtime");
        return;
    }
    // One deadline for every revoked partition: they finish their batches at the same time, so
    // a revoke of many partitions holds the rebalance for `timeout` at most, not `timeout` each.
    tokio::task::block_in_place(|| {
        rt.block_on(async {
            let deadline = tokio::time::Instant::now() + timeout;
            let waits = workers.into_iter().map(|w| async move {
                let abort = w.join.abort_handle();
                if tokio::time::timeout_at(deadline, w.join).await.is_err() {
                    tracing::warn!("a revoked partition's batch did not finish in time; abandoned");
                    abort.abort();
                }
            });
            futures::future::join_all(waits).await;
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    fn stuck_worker() -> WorkerHandle {
        WorkerHandle {
            stop: CancellationToken::new(),
            at_eof: Arc::new(AtomicBool::new(false)),
            join: tokio::spawn(std::future::pending()),
        }
    }

    /// Four partitions whose batches never finish hold the revoke for one timeout, not four, and
    /// are all abandoned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revoke_waits_one_shared_deadline_for_all_its_partitions() {
        let workers: Vec<WorkerHandle> = (0..4).map(|_| stuck_worker()).collect();
        let aborts: Vec<_> = workers.iter().map(|w| w.join.abort_handle()).collect();
        let started = std::time::Instant::now();
        wait_for_workers(workers, Duration::from_millis(500));
        let waited = started.elapsed();
        // One after another, they would take 2 s.
        assert!(waited < Duration::from_millis(1_900), "{waited:?}");
        assert!(waited >= Duration::from_millis(500), "{waited:?}");
        tokio::task::yield_now().await;
        for abort in aborts {
            let finished = tokio::time::timeout(Duration::from_secs(10), async {
                while !abort.is_finished() {
                    tokio::task::yield_now().await;
                }
            });
            assert!(finished.await.is_ok(), "an abandoned worker is aborted");
        }
    }
}
