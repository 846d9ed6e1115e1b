//! Compares the database with a model's [`Expected`] outcome: exact counts, exact balances.

use std::collections::BTreeMap;

use tokio_postgres::GenericClient;

use crate::generate::Expected;

/// What the database holds, in the model's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Rows in `inbox`.
    pub inbox: u64,
    /// Rows in `dead_letters` by reason.
    pub dead_letters: BTreeMap<String, u64>,
    /// Every balance.
    pub balances: BTreeMap<i64, i64>,
}

/// Reads the ledger's tables.
pub async fn observe(client: &impl GenericClient) -> Result<Observed, tokio_postgres::Error> {
    let inbox: i64 = client
        .query_one("SELECT count(*) FROM inbox", &[])
        .await?
        .get(0);
    let dead_letters = client
        .query(
            "SELECT reason, count(*) FROM dead_letters GROUP BY reason",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect();
    let balances = client
        .query("SELECT account_id, amount FROM balances", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Observed {
        inbox: inbox as u64,
        dead_letters,
        balances,
    })
}

/// Reads the expected outcome written by `produce --expect`.
pub fn read_expected(path: &std::path::Path) -> anyhow::Result<Expected> {
    use anyhow::Context;
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Every difference between what was observed and what was expected; empty when they agree.
/// Accounts that only ever received rejected debits exist at 0 in the database and may be
/// absent from the model, so zero balances missing from the model are not differences.
pub fn differences(observed: &Observed, expected: &Expected) -> Vec<String> {
    let mut diffs = Vec::new();
    if observed.inbox != expected.new {
        diffs.push(format!(
            "inbox has {} ids, expected {}",
            observed.inbox, expected.new
        ));
    }
    if observed.dead_letters != expected.dead_letters {
        diffs.push(format!(
            "dead letters {:?}, expected {:?}",
            observed.dead_letters, expected.dead_letters
        ));
    }
    let mut wrong = 0;
    for (account, amount) in &observed.balances {
        let want = expected.balances.get(account).copied().unwrap_or(0);
        if *amount != want {
            wrong += 1;
            if wrong <= 5 {
                diffs.push(format!(
                    "account {account}: balance {amount}, expected {want}"
                ));
            }
        }
    }
    let missing = expected
        .balances
        .iter()
        .filter(|(a, amount)| **amount != 0 && !observed.balances.contains_key(a))
        .count();
    if wrong > 0 || missing > 0 {
        diffs.push(format!("{wrong} wrong and {missing} missing balances"));
    }
    diffs
}
