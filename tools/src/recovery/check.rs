//! `recovery check`: where a recovered database differs from its input, record by record. The
//! model check (`verify`) says whether the database is exactly the model; this says why not:
//!
//! - lost: valid ids of the topic absent from the inbox, and bad records without their dead
//!   letter, with the offset ranges they sit in per partition;
//! - applied twice: the inbox's own rows replayed through the ledger's rule (each id applied
//!   once, at the position the inbox recorded, in offset order per partition) must give exactly
//!   the database's balances and rule dead letters (insufficient funds, amount overflow). Any
//!   other difference is an effect applied more than once (or applied without its inbox row),
//!   never a loss.
//!
//! The topic is read from Kafka's ConsoleConsumer output (partition, offset, headers, key,
//! value; a null value as `NULL`: `read_topic` in `scripts/recovery-lib.sh`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A record's place: partition, offset.
pub type Position = (i64, i64);

/// What a record of the topic carries for the ledger: its id and its entry (account, amount),
/// each `None` when the decoder refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicRecord {
    /// The id, by the decoder's rules.
    pub id: Option<Uuid>,
    /// The entry: account and amount.
    pub entry: Option<(i64, i64)>,
}

/// The database's side.
#[derive(Debug, Clone, Default)]
pub struct Database {
    /// The inbox's rows of the topic: id → position.
    pub inbox: HashMap<Uuid, Position>,
    /// The dead letters of the topic: position → reason.
    pub dead_letters: HashMap<Position, String>,
    /// Every balance.
    pub balances: HashMap<i64, i64>,
}

/// The dead-letter reasons of the ledger's rules (not bad input).
pub const RULES: [&str; 2] = ["insufficient_funds", "amount_overflow"];

/// The result, as `check` of the failover and restore reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// Records in the topic dump.
    pub topic_records: usize,
    /// Distinct valid ids.
    pub valid_ids: usize,
    /// Records without a valid id or entry.
    pub bad_records: usize,
    /// The inbox's rows of the topic.
    pub inbox_rows: usize,
    /// Valid ids not in the inbox.
    pub lost_valid_ids: usize,
    /// Where they sit, per partition.
    pub lost_valid_where: Vec<String>,
    /// Bad records without their dead letter.
    pub lost_dead_letters: usize,
    /// Where they sit, per partition.
    pub lost_dead_letters_where: Vec<String>,
    /// Inbox ids that no valid record of the topic carries.
    pub ids_not_in_topic: usize,
    /// Inbox rows whose position holds another record.
    pub inbox_rows_at_wrong_position: usize,
    /// Accounts whose balance differs from the replay of the inbox's rows.
    pub balances_differing_from_inbox_replay: usize,
    /// The first five of them.
    pub balances_differing_examples: Vec<Differing>,
    /// Rule dead letters the replay does not make, and the reverse.
    pub rule_dead_letters_differing_from_inbox_replay: usize,
    /// Anything applied more than once (or without its inbox row).
    pub applied_twice: bool,
}

/// An account whose balance differs from the replay's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Differing {
    /// The account.
    pub account: i64,
    /// Its balance in the database (0 when absent).
    pub database: i64,
    /// Its balance by the replay (0 when absent).
    pub inbox_replay: i64,
}

/// The records of a ConsoleConsumer dump (lines `Partition:P\tOffset:O\tHEADERS\tKEY\tVALUE`;
/// other lines are skipped).
pub fn read_topic(dump: &str) -> BTreeMap<Position, TopicRecord> {
    dump.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("Partition:")?;
            let (partition, rest) = digits_then_tab(rest)?;
            let (offset, rest) = digits_then_tab(rest.strip_prefix("Offset:")?)?;
            let (headers, rest) = rest.split_once('\t')?;
            let (_key, value) = rest.split_once('\t')?;
            let value = (value != "NULL").then_some(value);
            Some((
                (partition, offset),
                TopicRecord {
                    id: parse_id(headers),
                    entry: value.and_then(parse_entry),
                },
            ))
        })
        .collect()
}

fn digits_then_tab(s: &str) -> Option<(i64, &str)> {
    let (digits, rest) = s.split_once('\t')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, rest))
}

/// The decoder's id rule on ConsoleConsumer's headers (`NO_HEADERS`, or `k:v,k:v`): exactly one
/// `id` header, UUID text (whitespace around it ignored), not the nil or the max UUID.
pub fn parse_id(headers: &str) -> Option<Uuid> {
    if headers == "NO_HEADERS" {
        return None;
    }
    let mut ids = headers
        .split(',')
        .filter_map(|h| h.split_once(':').or(Some((h, ""))))
        .filter(|(k, _)| *k == "id")
        .map(|(_, v)| v);
    let (Some(id), None) = (ids.next(), ids.next()) else {
        return None;
    };
    Uuid::try_parse(id.trim())
        .ok()
        .filter(|u| !u.is_nil() && !u.is_max())
}

/// The ledger's entry: a JSON object whose `account_id` and `amount` are integers in i64.
pub fn parse_entry(value: &str) -> Option<(i64, i64)> {
    if !value.trim_start().starts_with('{') {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(value).ok()?;
    Some((v.get("account_id")?.as_i64()?, v.get("amount")?.as_i64()?))
}

/// `["p0: 12 between offsets 3130 and 4411", …]`: per partition, how many and where.
pub fn spans(positions: impl IntoIterator<Item = Position>) -> Vec<String> {
    let mut by: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (p, o) in positions {
        by.entry(p).or_default().push(o);
    }
    by.iter()
        .map(|(p, o)| {
            let (min, max) = (o.iter().min(), o.iter().max());
            format!(
                "p{p}: {} between offsets {} and {}",
                o.len(),
                min.copied().unwrap_or_default(),
                max.copied().unwrap_or_default()
            )
        })
        .collect()
}

/// The check of `db` against the topic's `records`.
pub fn check(records: &BTreeMap<Position, TopicRecord>, db: &Database) -> Check {
    let mut valid: HashMap<Uuid, Position> = HashMap::new();
    let mut bad = BTreeSet::new();
    for (pos, r) in records {
        match (r.id, r.entry) {
            (Some(id), Some(_)) => {
                // The first copy's position.
                valid.entry(id).or_insert(*pos);
            }
            _ => {
                bad.insert(*pos);
            }
        }
    }
    let lost_valid: Vec<Position> = valid
        .iter()
        .filter(|(id, _)| !db.inbox.contains_key(id))
        .map(|(_, pos)| *pos)
        .collect();
    let lost_bad: Vec<Position> = bad
        .iter()
        .filter(|pos| !db.dead_letters.contains_key(pos))
        .copied()
        .collect();
    let unknown: HashSet<Uuid> = db
        .inbox
        .keys()
        .filter(|id| !valid.contains_key(id))
        .copied()
        .collect();
    // Every inbox row at a position of the topic that carries its id.
    let misplaced = db
        .inbox
        .iter()
        .filter(|(id, pos)| {
            valid.contains_key(id) && records.get(pos).is_none_or(|r| r.id != Some(**id))
        })
        .count();

    // The inbox's rows replayed once each, in offset order per partition.
    let mut rows: Vec<(Position, Uuid)> = db.inbox.iter().map(|(id, pos)| (*pos, *id)).collect();
    rows.sort();
    let mut replay: BTreeMap<i64, i64> = BTreeMap::new();
    let mut refused: BTreeSet<Position> = BTreeSet::new();
    for (pos, id) in rows {
        let Some((account, amount)) = records.get(&pos).and_then(|r| r.entry) else {
            continue;
        };
        if unknown.contains(&id) {
            continue;
        }
        let balance = replay.entry(account).or_insert(0);
        let next = i128::from(*balance) + i128::from(amount);
        match i64::try_from(next) {
            Ok(next) if next >= 0 => *balance = next,
            _ => {
                refused.insert(pos);
            }
        }
    }
    let accounts: BTreeSet<i64> = replay.keys().chain(db.balances.keys()).copied().collect();
    let at = |m: &BTreeMap<i64, i64>, a: i64| m.get(&a).copied().unwrap_or(0);
    let differ: Vec<Differing> = accounts
        .into_iter()
        .map(|a| Differing {
            account: a,
            database: db.balances.get(&a).copied().unwrap_or(0),
            inbox_replay: at(&replay, a),
        })
        .filter(|d| d.database != d.inbox_replay)
        .collect();
    let rule_dead: BTreeSet<Position> = db
        .dead_letters
        .iter()
        .filter(|(_, reason)| RULES.contains(&reason.as_str()))
        .map(|(pos, _)| *pos)
        .collect();
    let rule_differing = rule_dead.symmetric_difference(&refused).count();
    Check {
        topic_records: records.len(),
        valid_ids: valid.len(),
        bad_records: bad.len(),
        inbox_rows: db.inbox.len(),
        lost_valid_ids: lost_valid.len(),
        lost_valid_where: spans(lost_valid),
        lost_dead_letters: lost_bad.len(),
        lost_dead_letters_where: spans(lost_bad),
        ids_not_in_topic: unknown.len(),
        inbox_rows_at_wrong_position: misplaced,
        balances_differing_from_inbox_replay: differ.len(),
        applied_twice: !differ.is_empty()
            || rule_differing > 0
            || !unknown.is_empty()
            || misplaced > 0,
        balances_differing_examples: differ.into_iter().take(5).collect(),
        rule_dead_letters_differing_from_inbox_replay: rule_differing,
    }
}

/// The database's side of topic `topic`, read at `url`.
pub async fn read_database(url: &str, topic: &str) -> Result<Database> {
    let pool = batch_inbox::db::connect(url, 1)
        .await
        .context("connecting to the database")?;
    let client = pool.get().await.context("connecting to the database")?;
    let inbox = client
        .query(
            r#"SELECT message_id, partition::int8, "offset" FROM inbox WHERE topic = $1"#,
            &[&topic],
        )
        .await
        .context("reading the inbox")?
        .iter()
        .map(|r| (r.get::<_, Uuid>(0), (r.get(1), r.get(2))))
        .collect();
    let dead_letters = client
        .query(
            r#"SELECT partition::int8, "offset", reason FROM dead_letters WHERE topic = $1"#,
            &[&topic],
        )
        .await
        .context("reading the dead letters")?
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect();
    let balances = client
        .query("SELECT account_id, amount FROM balances", &[])
        .await
        .context("reading the balances")?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Database {
        inbox,
        dead_letters,
        balances,
    })
}
