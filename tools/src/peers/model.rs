//! The generator's model as `scripts/peers/compare.sh` uses it: its counts, the check that the
//! bare topic's model is the envelope topic's, and a map of it as rows for `\copy`.

use std::fmt::Write as _;

use anyhow::{bail, Result};

use crate::generate::Expected;

/// The maps of the model `peers model-rows` prints, by their names in the model's JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Field {
    /// Customer → the id of its last new record.
    #[value(name = "last_new")]
    LastNew,
    /// Customer → the id of its last record, duplicates included.
    #[value(name = "last_sent")]
    LastSent,
    /// Account → the sum of its new records' amounts.
    Sums,
    /// Account → the ledger's balance.
    Balances,
}

/// `new duplicates customers accounts`: the new records, the duplicates, the customers with a
/// last new record, and the accounts with a sum.
pub fn counts(e: &Expected) -> String {
    format!(
        "{} {} {} {}",
        e.new,
        e.duplicates,
        e.last_new.len(),
        e.sums.len()
    )
}

/// An error naming what differs when the models of two topics of the same entries differ.
pub fn same(a: &Expected, b: &Expected) -> Result<()> {
    let differing: Vec<&str> = [
        ("records", a.records == b.records),
        ("new", a.new == b.new),
        ("duplicates", a.duplicates == b.duplicates),
        ("dead_letters", a.dead_letters == b.dead_letters),
        ("balances", a.balances == b.balances),
        ("sums", a.sums == b.sums),
    ]
    .iter()
    .filter(|(_, same)| !same)
    .map(|(name, _)| *name)
    .collect();
    if !differing.is_empty() {
        bail!(
            "the bare topic's model differs from the envelope topic's: {}",
            differing.join(", ")
        );
    }
    Ok(())
}

/// The map `field` of the model as `KEY\tVALUE` lines.
pub fn rows(e: &Expected, field: Field) -> String {
    let mut out = String::new();
    match field {
        Field::LastNew | Field::LastSent => {
            let map = if field == Field::LastNew {
                &e.last_new
            } else {
                &e.last_sent
            };
            for (k, v) in map {
                let _ = writeln!(out, "{k}\t{v}");
            }
        }
        Field::Sums | Field::Balances => {
            let map = if field == Field::Sums {
                &e.sums
            } else {
                &e.balances
            };
            for (k, v) in map {
                let _ = writeln!(out, "{k}\t{v}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn model() -> Expected {
        Expected {
            records: 10,
            new: 8,
            duplicates: 2,
            balances: BTreeMap::from([(1, 5), (2, 0)]),
            sums: BTreeMap::from([(1, 5), (2, -3), (3, 1)]),
            last_new: BTreeMap::from([(1, "a".into()), (2, "b".into())]),
            last_sent: BTreeMap::from([(1, "c".into())]),
            ..Expected::default()
        }
    }

    #[test]
    fn counts_are_new_duplicates_customers_accounts() {
        assert_eq!(counts(&model()), "8 2 2 3");
    }

    #[test]
    fn models_that_differ_name_what_differs() {
        assert!(same(&model(), &model()).is_ok());
        let mut other = model();
        other.sums.insert(4, 1);
        other.new = 9;
        // The maps of customers are not compared: the ids are drawn anew for the bare topic.
        other.last_new.clear();
        let err = same(&model(), &other).unwrap_err().to_string();
        assert!(err.ends_with(": new, sums"), "{err}");
    }

    #[test]
    fn rows_are_key_tab_value_lines() {
        assert_eq!(rows(&model(), Field::Sums), "1\t5\n2\t-3\n3\t1\n");
        assert_eq!(rows(&model(), Field::LastNew), "1\ta\n2\tb\n");
        assert_eq!(rows(&model(), Field::LastSent), "1\tc\n");
        assert_eq!(rows(&model(), Field::Balances), "1\t5\n2\t0\n");
    }
}
