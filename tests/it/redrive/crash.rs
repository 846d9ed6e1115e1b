//! A redrive killed in the middle (the binary, built with failpoints, aborts like `kill -9` just
//! before the COMMIT of its third batch) and run again applies every parked message exactly
//! once: the committed batches are marked and applied, the killed one left nothing behind.

use super::{counts, parked_sevens, redrive_bin, report, state};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_killed_midway_and_run_again_applies_each_message_once() {
    // 30 parked: entries 1, 3, …, 59 of account 7.
    let (world, total) = parked_sevens("redrive_crash", 60).await;
    let (url, pool) = world.db();
    let flags = ["--batch-size", "10"];
    let crash = [("FAILPOINTS", "redrive_before_commit=2*off->return(crash)")];
    let killed = redrive_bin(&url, &flags, &crash).await;
    assert_ne!(killed.code, Some(0), "{}", killed.stderr);
    assert!(
        killed
            .stderr
            .contains("failpoint redrive_before_commit: crashing"),
        "{}",
        killed.stderr
    );

    // Two batches committed: the first 20 parked entries (1, 3, …, 39) applied and marked.
    let s = state(&pool).await;
    let marked: Vec<i64> = s.letters.iter().filter(|l| l.6).map(|l| l.1).collect();
    assert_eq!(marked, (0..20).map(|i| 2 * i).collect::<Vec<i64>>());
    assert!(
        s.letters.iter().all(|l| l.5 == i32::from(l.6)),
        "attempts: {:?}",
        s.letters
    );
    let first_twenty: i64 = (0..20).map(|i| 2 * i + 1).sum();
    assert!(
        s.tables.balances.contains(&(7, first_twenty)),
        "{:?}",
        s.tables.balances
    );

    assert_eq!(
        report(&redrive_bin(&url, &flags, &[]).await),
        counts(10, 0, 0)
    );
    let s = state(&pool).await;
    assert!(
        s.tables.balances.contains(&(7, total)),
        "{:?}",
        s.tables.balances
    );
    assert_eq!(s.letters.len(), 30);
    assert!(s
        .letters
        .iter()
        .all(|l| l.4.as_deref() == Some("applied") && l.5 == 1));
    assert_eq!(report(&redrive_bin(&url, &[], &[]).await), counts(0, 0, 0));
    assert_eq!(state(&pool).await, s);
}
