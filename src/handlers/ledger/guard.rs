//! The ledger's optimistic path, as plain data: per account, the net change of a batch's entries
//! and the range of starting balances from which every entry is accepted.
//!
//! Invariant: a starting balance takes every entry of the account, in order, without a rejection
//! (and then ends at `balance + delta`) exactly when it lies in `need..=headroom`: inside, the
//! optimistic update gives the exact rules' result ([`super::apply`]); outside, at least one entry
//! is rejected and the account needs the exact rules.

use std::collections::BTreeMap;

use super::Entry;

/// The optimistic update of one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Guard {
    /// The account.
    pub account_id: i64,
    /// Sum of the account's amounts.
    pub delta: i64,
    /// Lowest starting balance for which no running balance goes below zero: minus the most
    /// negative running sum (0 when none is negative).
    pub need: i64,
    /// Highest starting balance for which no running balance overflows: `i64::MAX` minus the
    /// highest running sum (`i64::MAX` when none is positive).
    pub headroom: i64,
}

/// Running sums of one account's amounts.
#[derive(Debug, Clone, Copy, Default)]
struct Running {
    sum: i64,
    lowest: i64,
    highest: i64,
    overflowed: bool,
}

impl Running {
    fn add(&mut self, amount: i64) {
        match self.sum.checked_add(amount) {
            Some(sum) if !self.overflowed => {
                self.sum = sum;
                self.lowest = self.lowest.min(sum);
                self.highest = self.highest.max(sum);
            }
            _ => self.overflowed = true,
        }
    }

    fn guard(self, account_id: i64) -> Option<Guard> {
        if self.overflowed {
            return None;
        }
        Some(Guard {
            account_id,
            delta: self.sum,
            need: self.lowest.checked_neg()?,
            headroom: i64::MAX - self.highest,
        })
    }
}

/// The accounts of `entries` in ascending order, each with its guard, or `None` when its running
/// sum overflows (such an account always takes the exact path).
pub(crate) fn guards<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Vec<(i64, Option<Guard>)> {
    let mut running: BTreeMap<i64, Running> = BTreeMap::new();
    for entry in entries {
        running
            .entry(entry.account_id)
            .or_default()
            .add(entry.amount);
    }
    running
        .into_iter()
        .map(|(account, r)| (account, r.guard(account)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::handlers::ledger::apply;

    fn e(account_id: i64, amount: i64) -> Entry {
        Entry { account_id, amount }
    }

    fn guard_of(entries: &[Entry]) -> Option<Guard> {
        guards(entries).first().and_then(|(_, g)| *g)
    }

    #[test]
    fn the_guard_is_the_lowest_and_highest_running_sum() {
        let g = guard_of(&[e(1, 10), e(1, -25), e(1, 5)]).unwrap();
        assert_eq!((g.delta, g.need, g.headroom), (-10, 15, i64::MAX - 10));
        let credits = guard_of(&[e(1, 3), e(1, 4)]).unwrap();
        assert_eq!((credits.delta, credits.need), (7, 0));
        assert_eq!(guard_of(&[e(1, i64::MAX), e(1, 1)]), None);
        assert_eq!(guard_of(&[e(1, i64::MIN)]), None, "need would overflow");
    }

    #[test]
    fn accounts_come_out_sorted_once_each() {
        let list = guards(&[e(9, 1), e(2, 1), e(9, -1), e(5, 2)]);
        let accounts: Vec<i64> = list.iter().map(|(a, _)| *a).collect();
        assert_eq!(accounts, vec![2, 5, 9]);
    }

    /// For every starting balance in a range around the guard's bounds, the guard holds exactly
    /// where the exact rules accept every entry, and the result is then `balance + delta`.
    #[test]
    fn the_guard_holds_exactly_where_the_exact_rules_reject_nothing() {
        let cases: [&[i64]; 5] = [
            &[-5, 10, -7, -7],
            &[3, -3, -3, 8],
            &[-1],
            &[i64::MAX - 2, 1, -4],
            &[4, 4],
        ];
        for amounts in cases {
            let entries: Vec<Entry> = amounts.iter().map(|a| e(1, *a)).collect();
            let g = guard_of(&entries).unwrap();
            for start in (0..40).chain([i64::MAX - 3, i64::MAX - 2, i64::MAX - 1, i64::MAX]) {
                let mut balances = HashMap::from([(1, start)]);
                let rejected = apply(&mut balances, &entries);
                if (g.need..=g.headroom).contains(&start) {
                    assert!(rejected.is_empty(), "{amounts:?} from {start}");
                    assert_eq!(balances[&1], start + g.delta, "{amounts:?} from {start}");
                } else {
                    assert!(!rejected.is_empty(), "{amounts:?} from {start}");
                }
            }
        }
    }
}
