//! Ledger input with duplicates, bad input and overdrafts, and the model of what applying it
//! must produce. The input is determined by the seed, except UUIDv7 ids, which carry the time
//! they were generated (as real v7 ids do): with `id_version` 4 a seed gives the same ids.
//!
//! The model applies records in production order: a record keyed by its account lands in one
//! partition, so per-account order in the topic is production order, and the ledger's rules are
//! per account. A run is correct when the database equals [`Expected`].

use std::collections::{BTreeMap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use batch_inbox::internals::message::parse_id;
use batch_inbox::ledger::{apply_amount, Entry, AMOUNT_OVERFLOW, INSUFFICIENT_FUNDS};
use batch_inbox::Reason;

/// Shape of the generated input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GeneratorSettings {
    /// Records to produce, duplicates and bad ones included.
    pub messages: u64,
    /// Number of accounts (ids 1..=accounts).
    pub accounts: u64,
    /// Share of records that re-send an earlier id (half close by, half far back).
    pub duplicate_ratio: f64,
    /// Share of records that are bad input, cycling through every kind.
    pub bad_ratio: f64,
    /// Share of new records that are debits (some of them overdraw).
    pub debit_ratio: f64,
    /// UUID version of the ids: 4 (random) or 7 (time-ordered).
    pub id_version: u8,
    /// Seed of the generator.
    pub seed: u64,
    /// How records spread over accounts.
    #[serde(default)]
    pub keys: KeyDistribution,
}

/// How records spread over accounts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KeyDistribution {
    /// Every account equally likely.
    #[default]
    Uniform,
    /// Zipf with exponent 1: account k is drawn with weight 1/k (a few hot accounts).
    Zipf,
}

/// Draws account ids 1..=n by cumulative weights.
#[derive(Debug)]
struct Accounts {
    cdf: Option<Vec<f64>>,
    n: u64,
}

impl Accounts {
    fn new(n: u64, keys: KeyDistribution) -> Self {
        let n = n.max(1);
        let cdf = (keys == KeyDistribution::Zipf).then(|| {
            let mut total = 0.0;
            let mut cdf: Vec<f64> = (1..=n)
                .map(|k| {
                    total += 1.0 / k as f64;
                    total
                })
                .collect();
            cdf.iter_mut().for_each(|c| *c /= total);
            cdf
        });
        Self { cdf, n }
    }

    fn draw(&self, rng: &mut StdRng) -> i64 {
        match &self.cdf {
            None => rng.random_range(1..=self.n) as i64,
            Some(cdf) => {
                let u: f64 = rng.random();
                (cdf.partition_point(|c| *c < u) as i64 + 1).min(self.n as i64)
            }
        }
    }
}

impl Default for GeneratorSettings {
    fn default() -> Self {
        Self {
            messages: 10_000,
            accounts: 1_000,
            duplicate_ratio: 0.1,
            bad_ratio: 0.01,
            debit_ratio: 0.4,
            id_version: 7,
            seed: 1,
            keys: KeyDistribution::Uniform,
        }
    }
}

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Record key (the account id as text).
    pub key: String,
    /// Record value (`None`: no value at all).
    pub value: Option<Vec<u8>>,
    /// The `id` header value (`None`: no header).
    pub id: Option<String>,
}

/// What applying the input must leave in the database.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    /// Records produced.
    pub records: u64,
    /// Distinct valid ids: the inbox's rows.
    pub new: u64,
    /// Valid records whose id was seen before.
    pub duplicates: u64,
    /// Dead letters by reason (bad input and rejections).
    pub dead_letters: BTreeMap<String, u64>,
    /// Final balance of every account that received a valid message.
    pub balances: BTreeMap<i64, i64>,
    /// Sum of the amounts of every new valid message per account, overdrafts included: the
    /// balances without the ledger's rules (the SQL handler's `balances_upsert.sql`).
    #[serde(default)]
    pub sums: BTreeMap<i64, i64>,
    /// Records with a valid id whose value is JSON but no entry (`{"account_id": "7", …}`): the
    /// ledger dead-letters them when decoding, the SQL statement rejects them, so their ids
    /// are in the SQL handler's inbox (the generator gives each a fresh id).
    #[serde(default)]
    pub json_not_entries: u64,
    /// Id of the last new valid record of each account, in production order: the row a
    /// last-write-wins upsert by key leaves when each id is applied once.
    #[serde(default)]
    pub last_new: BTreeMap<i64, String>,
    /// Id of the last valid record of each account, duplicates included: the row an upsert by
    /// key leaves when it applies every record it reads, a re-sent older one too.
    #[serde(default)]
    pub last_sent: BTreeMap<i64, String>,
}

impl Expected {
    /// Sum of all balances.
    pub fn total(&self) -> i64 {
        self.balances.values().sum()
    }

    /// The outcome of adding up every new valid entry, without the ledger's rules: balances are
    /// [`Expected::sums`], there are no overdraft rejections, and values that are JSON but no
    /// entry are rejected after the dedup (their ids enter the inbox) under the same reason.
    pub fn summed(&self) -> Expected {
        let rules = [INSUFFICIENT_FUNDS, AMOUNT_OVERFLOW];
        let mut dead_letters = self.dead_letters.clone();
        dead_letters.retain(|reason, _| !rules.iter().any(|r| r.as_str() == reason));
        Expected {
            new: self.new + self.json_not_entries,
            dead_letters,
            balances: self.sums.clone(),
            ..self.clone()
        }
    }
}

fn is_json(value: Option<&[u8]>) -> bool {
    value.is_some_and(|v| serde_json::from_slice::<serde::de::IgnoredAny>(v).is_ok())
}

/// Applies records to the model, in production order.
#[derive(Debug, Default)]
pub struct Model {
    seen: HashSet<Uuid>,
    expected: Expected,
}

impl Model {
    /// Applies one record as the processor must.
    pub fn apply(&mut self, r: &Record) {
        self.expected.records += 1;
        // The decoder's own id rules (`message::parse_id`): one id header, a UUID, not nil/max.
        let id = r.id.as_deref().map(|s| parse_id(s.as_bytes()));
        let reason = match id {
            None => Err(Reason::MissingId),
            Some(Err((reason, _))) => Err(reason),
            Some(Ok(id)) => Entry::parse(r.value.as_deref())
                .map(|entry| (id, entry))
                .map_err(|(reason, _)| reason),
        };
        match reason {
            Err(Reason::InvalidPayload) if is_json(r.value.as_deref()) => {
                self.expected.json_not_entries += 1;
                self.dead_letter(Reason::InvalidPayload);
            }
            Err(reason) => self.dead_letter(reason),
            Ok((id, entry)) => {
                let id_text = r.id.clone().unwrap_or_default();
                self.expected
                    .last_sent
                    .insert(entry.account_id, id_text.clone());
                if !self.seen.insert(id) {
                    self.expected.duplicates += 1;
                    return;
                }
                self.expected.new += 1;
                self.expected.last_new.insert(entry.account_id, id_text);
                let sum = self.expected.sums.entry(entry.account_id).or_insert(0);
                *sum = sum.saturating_add(entry.amount);
                let balance = self.expected.balances.entry(entry.account_id).or_insert(0);
                match apply_amount(*balance, entry.amount) {
                    Ok(next) => *balance = next,
                    Err((reason, _)) => self.dead_letter(reason),
                }
            }
        }
    }

    fn dead_letter(&mut self, reason: Reason) {
        *self
            .expected
            .dead_letters
            .entry(reason.as_str().to_owned())
            .or_default() += 1;
    }

    /// The expected outcome of everything applied so far.
    pub fn expected(&self) -> &Expected {
        &self.expected
    }
}

/// Generates records deterministically from the settings' seed.
pub struct Generator {
    settings: GeneratorSettings,
    accounts: Accounts,
    rng: StdRng,
    valid: Vec<Record>,
    produced: u64,
    bad_kind: usize,
}

impl Generator {
    /// A generator for `settings`.
    pub fn new(settings: GeneratorSettings) -> Self {
        let rng = StdRng::seed_from_u64(settings.seed);
        Self {
            accounts: Accounts::new(settings.accounts, settings.keys),
            settings,
            rng,
            valid: Vec::new(),
            produced: 0,
            bad_kind: 0,
        }
    }

    fn new_id(&mut self) -> Uuid {
        let bytes: [u8; 16] = self.rng.random();
        if self.settings.id_version == 7 {
            // Time-ordered: the current time in the high bits, then random bits.
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let mut rand10 = [0u8; 10];
            rand10.copy_from_slice(&bytes[..10]);
            uuid::Builder::from_unix_timestamp_millis(ms, &rand10).into_uuid()
        } else {
            uuid::Builder::from_random_bytes(bytes).into_uuid()
        }
    }

    fn bad(&mut self, account: i64) -> Record {
        let id = Some(self.new_id().to_string());
        let key = account.to_string();
        let good = Some(format!(r#"{{"account_id":{account},"amount":5}}"#).into_bytes());
        self.bad_kind = (self.bad_kind + 1) % 6;
        match self.bad_kind {
            0 => Record {
                key,
                value: good,
                id: None,
            },
            1 => Record {
                key,
                value: good,
                id: Some("not-a-uuid".to_owned()),
            },
            2 => Record {
                key,
                value: None,
                id,
            },
            3 => Record {
                key,
                value: Some(Vec::new()),
                id,
            },
            4 => Record {
                key,
                value: Some(b"{\"account_id\":".to_vec()),
                id,
            },
            _ => Record {
                key,
                value: Some(format!(r#"{{"account_id":"{account}","amount":"x"}}"#).into_bytes()),
                id,
            },
        }
    }

    fn duplicate(&mut self) -> Option<Record> {
        let n = self.valid.len();
        if n == 0 {
            return None;
        }
        let index = if self.rng.random_bool(0.5) {
            n - 1 - self.rng.random_range(0..n.min(16))
        } else {
            self.rng.random_range(0..n)
        };
        Some(self.valid[index].clone())
    }

    fn fresh(&mut self, account: i64) -> Record {
        let magnitude: i64 = self.rng.random_range(1..=1_000);
        let amount = if self
            .rng
            .random_bool(self.settings.debit_ratio.clamp(0.0, 1.0))
        {
            -magnitude
        } else {
            magnitude
        };
        let value = serde_json::to_vec(&Entry {
            account_id: account,
            amount,
        })
        .expect("an Entry always serializes");
        let record = Record {
            key: account.to_string(),
            value: Some(value),
            id: Some(self.new_id().to_string()),
        };
        self.valid.push(record.clone());
        record
    }
}

impl Iterator for Generator {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        if self.produced >= self.settings.messages {
            return None;
        }
        self.produced += 1;
        let account = self.accounts.draw(&mut self.rng);
        let roll: f64 = self.rng.random();
        let bad = self.settings.bad_ratio;
        let dup = self.settings.duplicate_ratio;
        let record = if roll < bad {
            self.bad(account)
        } else if roll < bad + dup {
            match self.duplicate() {
                Some(r) => r,
                None => self.fresh(account),
            }
        } else {
            self.fresh(account)
        };
        Some(record)
    }
}

/// What `produce` wraps the value of a valid record in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ValueEnvelope {
    /// Nothing: the entry itself, `{"account_id":7,"amount":-5}`.
    #[default]
    Bare,
    /// A Kafka Connect JSON envelope, as Connect's `JsonConverter` with `schemas.enable=true`
    /// reads it: `{"schema":{…},"payload":{"id":"…","account_id":7,"amount":-5}}`. The payload
    /// also carries the record's id, so that a sink that keeps only the payload (Debezium's JDBC
    /// sink) stores which record it applied. A record without an id header, or whose value is
    /// no entry, is written as it is.
    ConnectJson,
}

/// The Connect schema of [`ValueEnvelope::ConnectJson`]'s payload.
const ENTRY_SCHEMA: &str = r#"{"type":"struct","name":"batch_inbox.Entry","optional":false,"fields":[{"field":"id","type":"string","optional":false},{"field":"account_id","type":"int64","optional":false},{"field":"amount","type":"int64","optional":false}]}"#;

impl ValueEnvelope {
    /// The record as this format writes it: an entry with an id header wrapped, any other record
    /// unchanged.
    pub fn write(self, record: Record) -> Record {
        if self == ValueEnvelope::Bare {
            return record;
        }
        let (Some(id), Ok(entry)) = (record.id.as_deref(), Entry::parse(record.value.as_deref()))
        else {
            return record;
        };
        let payload = serde_json::json!({
            "id": id,
            "account_id": entry.account_id,
            "amount": entry.amount,
        });
        let value = format!(r#"{{"schema":{ENTRY_SCHEMA},"payload":{payload}}}"#).into_bytes();
        Record {
            value: Some(value),
            ..record
        }
    }
}

/// Generates the whole input and its expected outcome.
pub fn generate(settings: GeneratorSettings) -> (Vec<Record>, Expected) {
    let mut model = Model::default();
    let records: Vec<Record> = Generator::new(settings)
        .inspect(|r| model.apply(r))
        .collect();
    (records, model.expected)
}

#[cfg(test)]
mod tests;
