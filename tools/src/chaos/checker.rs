//! The invariant checker: the database against the generator's model, the committed offsets,
//! the final lag, and whether the faults actually hit.
//!
//! Each invariant is checked exactly, and says in its detail whether a violation means loss (a
//! valid message without effect) or double application (an effect applied more than once).

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::generate::{Expected, Record};
use batch_inbox::ledger::Entry;

use super::offsets::{PartitionLag, Regression, Samples};

/// One checked invariant.
#[derive(Debug, Clone, Serialize)]
pub struct Invariant {
    /// Short name.
    pub name: String,
    /// Whether it holds.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

impl Invariant {
    fn new(name: &str, ok: bool, detail: String) -> Self {
        Self {
            name: name.to_owned(),
            ok,
            detail,
        }
    }
}

/// The valid distinct ids of the input: a parseable id and a valid ledger value.
pub fn valid_ids(records: &[Record]) -> HashSet<Uuid> {
    records
        .iter()
        .filter(|r| Entry::parse(r.value.as_deref()).is_ok())
        .filter_map(|r| r.id.as_deref().and_then(|s| Uuid::try_parse(s.trim()).ok()))
        .collect()
}

/// The ids in the inbox.
pub async fn inbox_ids_of(
    client: &impl GenericClient,
) -> Result<HashSet<Uuid>, tokio_postgres::Error> {
    Ok(client
        .query("SELECT message_id FROM inbox", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Every produced record can be read back from the topic; valid ids missing from the inbox are
/// split into those the broker no longer has and those the processors skipped.
pub fn topic_complete(
    contents: &super::topic::TopicContents,
    valid: &HashSet<Uuid>,
    inbox: &HashSet<Uuid>,
    produced: u64,
) -> Invariant {
    let absent = valid
        .iter()
        .filter(|id| !contents.ids.contains_key(id))
        .count();
    let mut skipped: Vec<(i32, i64)> = valid
        .iter()
        .filter(|id| !inbox.contains(id))
        .filter_map(|id| contents.ids.get(id).copied())
        .collect();
    skipped.sort_unstable();
    let at: Vec<String> = skipped
        .iter()
        .take(10)
        .map(|(p, o)| format!("p{p}@{o}"))
        .collect();
    let ok = contents.complete && contents.records == produced && absent == 0;
    let place = if at.is_empty() {
        String::new()
    } else {
        format!(" at {}", at.join(", "))
    };
    let sequence = if contents.out_of_sequence == 0 {
        String::new()
    } else {
        let first: Vec<String> = contents
            .out_of_sequence_at
            .iter()
            .map(|(p, want, got)| format!("p{p}: {got} after {}", want - 1))
            .collect();
        format!(
            " ({} records out of offset sequence: {})",
            contents.out_of_sequence,
            first.join(", ")
        )
    };
    let detail =
        format!(
        "{} of {produced} records read back{}{sequence}; {absent} valid ids absent from the topic (lost by \
         the broker); {} valid ids in the topic but not in the inbox (skipped by the \
         processors){place}",
        contents.records,
        if contents.complete { "" } else { " (not to the end)" },
        skipped.len(),
    );
    Invariant::new("topic_complete", ok, detail)
}

/// Balances, their sum, inbox ids and dead letters against the model.
///
/// With `slack` (RabbitMQ), dead letters of bad input may exceed the model by the extra
/// deliveries the queues committed (see [`DeadLetterSlack`]); without it (Kafka, where a dead
/// letter's key is the record's offset) every reason must equal the model.
pub async fn database(
    client: &impl GenericClient,
    valid: &HashSet<Uuid>,
    expected: &Expected,
    slack: Option<&DeadLetterSlack>,
) -> Result<Vec<Invariant>, tokio_postgres::Error> {
    let balances: BTreeMap<i64, i64> = client
        .query("SELECT account_id, amount FROM balances", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let inbox = inbox_ids_of(client).await?;
    let dead: BTreeMap<String, u64> = client
        .query(
            "SELECT reason, count(*) FROM dead_letters GROUP BY reason",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect();
    Ok(vec![
        sum_of_balances(&balances, expected),
        every_balance(&balances, expected),
        inbox_ids(&inbox, valid),
        dead_letters(&dead, expected, slack),
    ])
}

fn sum_of_balances(balances: &BTreeMap<i64, i64>, expected: &Expected) -> Invariant {
    let (got, want) = (balances.values().sum::<i64>(), expected.total());
    let detail = match got.cmp(&want) {
        std::cmp::Ordering::Equal => format!("{got} = model"),
        std::cmp::Ordering::Greater => format!("{got}, model {want}: {} too much", got - want),
        std::cmp::Ordering::Less => format!("{got}, model {want}: {} missing", want - got),
    };
    Invariant::new("sum_of_balances", got == want, detail)
}

fn every_balance(balances: &BTreeMap<i64, i64>, expected: &Expected) -> Invariant {
    let accounts: HashSet<i64> = balances
        .keys()
        .chain(expected.balances.keys())
        .copied()
        .collect();
    let mut wrong: Vec<(i64, i64, i64)> = accounts
        .into_iter()
        .filter_map(|a| {
            let got = balances.get(&a).copied().unwrap_or(0);
            let want = expected.balances.get(&a).copied().unwrap_or(0);
            (got != want).then_some((a, got, want))
        })
        .collect();
    wrong.sort_unstable();
    let detail = if wrong.is_empty() {
        format!("{} accounts equal the model", expected.balances.len())
    } else {
        let first: Vec<String> = wrong
            .iter()
            .take(5)
            .map(|(a, got, want)| format!("account {a}: {got}, model {want}"))
            .collect();
        format!("{} accounts differ ({})", wrong.len(), first.join("; "))
    };
    Invariant::new("every_balance", wrong.is_empty(), detail)
}

fn inbox_ids(inbox: &HashSet<Uuid>, valid: &HashSet<Uuid>) -> Invariant {
    let lost = valid.difference(inbox).count();
    let unknown = inbox.difference(valid).count();
    let detail = format!(
        "{} ids, model {}: {lost} valid ids missing (lost), {unknown} ids not in the input",
        inbox.len(),
        valid.len()
    );
    Invariant::new("inbox_ids", lost == 0 && unknown == 0, detail)
}

/// What a RabbitMQ run may add to the model's dead letters. A delivery that comes back (its
/// acknowledgement lost after the COMMIT, or a publish the broker received twice) gets a new
/// position, and a bad record has no id the inbox could skip it by, so it is dead-lettered once
/// per delivery (docs/RABBITMQ.md). A rejected record with a valid id enters the inbox and is
/// never dead-lettered twice.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterSlack {
    /// Reasons of bad input (no id, an invalid id, a value that is no ledger entry).
    pub bad_input: std::collections::BTreeSet<String>,
    /// Deliveries committed beyond the records published (the positions' sum minus them).
    pub extra_deliveries: u64,
}

fn dead_letters(
    dead: &BTreeMap<String, u64>,
    expected: &Expected,
    slack: Option<&DeadLetterSlack>,
) -> Invariant {
    let Some(slack) = slack else {
        let ok = *dead == expected.dead_letters;
        let detail = if ok {
            format!("{dead:?} = model")
        } else {
            format!("{dead:?}, model {:?}", expected.dead_letters)
        };
        return Invariant::new("dead_letters", ok, detail);
    };
    let reasons: std::collections::BTreeSet<&String> =
        dead.keys().chain(expected.dead_letters.keys()).collect();
    let mut below = Vec::new();
    let mut above_exact = Vec::new();
    let mut extra = 0u64;
    for r in reasons {
        let got = dead.get(r).copied().unwrap_or(0);
        let want = expected.dead_letters.get(r).copied().unwrap_or(0);
        if got < want {
            below.push(format!("{r} {got} < {want}"));
        } else if slack.bad_input.contains(r) {
            extra += got - want;
        } else if got > want {
            above_exact.push(format!("{r} {got} > {want}"));
        }
    }
    let ok = below.is_empty() && above_exact.is_empty() && extra <= slack.extra_deliveries;
    let mut detail = format!(
        "{dead:?}, model {:?}: {extra} dead letters of bad input delivered again (at most the \
         {} deliveries committed beyond the input)",
        expected.dead_letters, slack.extra_deliveries
    );
    if !below.is_empty() {
        detail.push_str(&format!("; missing (lost): {}", below.join(", ")));
    }
    if !above_exact.is_empty() {
        detail.push_str(&format!(
            "; rejections of records with an id dead-lettered twice: {}",
            above_exact.join(", ")
        ));
    }
    Invariant::new("dead_letters", ok, detail)
}

/// How long after a paused member resumed a backwards move is attributed to its stale commit
/// (the sampler looks every 500 ms).
const ZOMBIE_WINDOW_S: (f64, f64) = (-0.5, 2.5);

/// A failover the nemesis made: when it began, and the promoted database's positions.
#[derive(Debug, Clone)]
pub struct Failover {
    /// Seconds since the run started.
    pub at_s: f64,
    /// Next offset of each partition the promoted database held (absent: no row, so the
    /// partition's beginning).
    pub positions: BTreeMap<i32, i64>,
}

/// Committed offsets never moved backwards, but to the database's position after the database
/// went back in time: a move after a failover that lands at or above the promoted database's
/// position of that partition is the processors following the database (listed, not a
/// violation), one below it is. Unless `strict`, a move within a moment after a paused member
/// resumed (`resumes`, seconds) is listed but tolerated: it is that member's stale commit,
/// which a fencing broker rejects and a non-fencing one accepts.
pub fn offsets_monotonic(
    samples: &Samples,
    resumes: &[f64],
    failovers: &[Failover],
    strict: bool,
) -> Invariant {
    let after_pause = |at: f64| {
        resumes
            .iter()
            .any(|r| (r + ZOMBIE_WINDOW_S.0..=r + ZOMBIE_WINDOW_S.1).contains(&at))
    };
    // The latest failover before the move: the database's position the move may go back to.
    let to_database = |r: &Regression| {
        failovers
            .iter()
            .rfind(|f| f.at_s <= r.at_s)
            .is_some_and(|f| r.to >= f.positions.get(&r.partition).copied().unwrap_or(0))
    };
    let (followed, rest): (Vec<&Regression>, Vec<&Regression>) =
        samples.regressions.iter().partition(|r| to_database(r));
    let (zombie, other): (Vec<&Regression>, Vec<&Regression>) = rest
        .into_iter()
        .partition(|r| !strict && after_pause(r.at_s));
    let ok = other.is_empty() && samples.samples > 0;
    let show = |r: &Regression| {
        format!(
            "partition {} from {} to {} at {:.1}s",
            r.partition, r.from, r.to, r.at_s
        )
    };
    let mut detail = match other.first() {
        None => format!(
            "{} samples, {} advances, no regression",
            samples.samples, samples.advances
        ),
        Some(r) => format!(
            "{} regressions in {} samples; first: {}",
            other.len(),
            samples.samples,
            show(r)
        ),
    };
    if !followed.is_empty() {
        let list: Vec<String> = followed.iter().map(|r| show(r)).collect();
        detail.push_str(&format!(
            "; back to the database's position after a failover (at or above the promoted \
             database's): {}",
            list.join(", ")
        ));
    }
    if !zombie.is_empty() {
        let list: Vec<String> = zombie.iter().map(|r| show(r)).collect();
        detail.push_str(&format!(
            "; tolerated, right after a paused member resumed (stale commit the broker \
             accepted): {}",
            list.join(", ")
        ));
    }
    Invariant::new("offsets_monotonic", ok, detail)
}

/// Every partition committed up to its high watermark. When `strict`, a committed offset past
/// the high watermark is a violation too (the broker reported an end below records it served);
/// otherwise it is listed and tolerated.
pub fn lag_zero(lag: &[PartitionLag], strict: bool) -> Invariant {
    let behind: Vec<String> = lag
        .iter()
        .filter(|l| l.lag() != 0 || (strict && l.ahead()))
        .map(|l| format!("p{}: {:?}/{}", l.partition, l.committed, l.high_watermark))
        .collect();
    let ok = !lag.is_empty() && behind.is_empty();
    let detail = if lag.is_empty() {
        "offsets could not be read".to_owned()
    } else if ok {
        let total: i64 = lag.iter().map(|l| l.high_watermark).sum();
        let ahead: Vec<String> = lag
            .iter()
            .filter(|l| l.ahead())
            .map(|l| format!("p{}: {:?}/{}", l.partition, l.committed, l.high_watermark))
            .collect();
        let note = if ahead.is_empty() {
            String::new()
        } else {
            format!(
                "; committed past the broker's high watermark: {}",
                ahead.join(", ")
            )
        };
        format!(
            "{} partitions committed to their end ({total} records){note}",
            lag.len()
        )
    } else {
        format!("not at the end: {}", behind.join(", "))
    };
    Invariant::new("lag_zero", ok, detail)
}

/// Each named count is above zero.
pub fn faults_hit(counts: &[(&str, u64)]) -> Invariant {
    let zero: Vec<&str> = counts
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(k, _)| *k)
        .collect();
    let all: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let detail = if zero.is_empty() {
        all.join(", ")
    } else {
        format!("none of: {} ({})", zero.join(", "), all.join(", "))
    };
    Invariant::new("faults_hit", zero.is_empty(), detail)
}

#[cfg(test)]
mod tests;
