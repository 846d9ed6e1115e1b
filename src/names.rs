//! Settings as text, parsed by the library itself so that no command-line library is part of its
//! types: the ones that take one of a few names (`batched`, `per-message`), and intervals
//! (`10s`, `500ms`).

use std::time::Duration;

/// The longest interval [`parse_interval`] takes: a day.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(86_400);

/// Parses an interval: `10s`, `500ms`, `2m`, or a number of seconds; `0` turns it off. Longer
/// than a day (`MAX_INTERVAL`) is refused.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    // Written here rather than with `humantime::parse_duration` (2.4), which reads these forms
    // differently: it refuses a bare number of seconds (`7`, `86400`), a documented form, and
    // takes many this refuses (`1h30m`, `5h`, `1.5s`, `10 s`, `2min`, `500us`, `1M`), so every
    // flag that takes an interval would change what it accepts, and its errors would change.
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let too_long = || format!("{s:?} is longer than a day (1440m)");
    let n: u64 = match number.parse() {
        Ok(n) => n,
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => return Err(too_long()),
        Err(_) => {
            return Err(format!(
                "expected an interval like 10s, 500ms or 1m, got {s:?}"
            ))
        }
    };
    let interval = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s or m")),
    };
    if interval > MAX_INTERVAL {
        return Err(too_long());
    }
    Ok(interval)
}

/// A name that is not one of a setting's names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {given:?} (expected one of: {})", expected.join(", "))]
pub struct UnknownName {
    /// The text given.
    pub given: String,
    /// The names the setting takes.
    pub expected: &'static [&'static str],
}

/// A setting whose values each have one name: [`std::str::FromStr`] takes exactly these names,
/// [`std::fmt::Display`] shows them.
pub trait Named:
    std::str::FromStr<Err = UnknownName> + std::fmt::Display + Copy + Send + Sync + 'static
{
    /// Every name, in the order of the variants.
    const NAMES: &'static [&'static str];
}

/// Implements [`Named`], `FromStr` and `Display` for a fieldless enum from its variants' names.
macro_rules! named {
    ($ty:ty { $($variant:ident = $name:literal),+ $(,)? }) => {
        impl $crate::names::Named for $ty {
            const NAMES: &'static [&'static str] = &[$($name),+];
        }
        impl std::str::FromStr for $ty {
            type Err = $crate::names::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok(Self::$variant),)+
                    _ => Err($crate::names::UnknownName {
                        given: s.to_owned(),
                        expected: <$ty as $crate::names::Named>::NAMES,
                    }),
                }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    $(Self::$variant => $name,)+
                })
            }
        }
    };
}
pub(crate) use named;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::batcher::Batching;
    use crate::pipeline::inbox::Mode;

    fn round_trip<T: Named + PartialEq + std::fmt::Debug>() {
        for name in T::NAMES {
            let value: T = name.parse().unwrap();
            assert_eq!(value.to_string(), *name);
        }
        for wrong in ["", "BATCHED", " linger", "per_message", "jsön"] {
            let e = wrong.parse::<T>().unwrap_err();
            assert_eq!(e.given, wrong);
            assert_eq!(e.expected, T::NAMES);
        }
    }

    #[test]
    fn every_name_parses_back_and_others_are_refused() {
        round_trip::<Mode>();
        round_trip::<Batching>();
        assert_eq!(Mode::NAMES, ["batched", "per-message"]);
        assert_eq!(Batching::NAMES, ["linger", "natural"]);
    }

    #[test]
    fn intervals_take_a_unit() {
        assert_eq!(parse_interval("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert!(parse_interval("5h").unwrap_err().contains("unknown unit"));
        assert!(parse_interval("soon").is_err());
    }

    #[test]
    fn absurd_intervals_are_refused_not_overflowed() {
        assert_eq!(parse_interval("1440m"), Ok(MAX_INTERVAL));
        assert_eq!(parse_interval("86400"), Ok(MAX_INTERVAL));
        for absurd in [
            "1441m",
            "86401s",
            "86400001ms",
            "307445734561825861m", // times 60 overflows u64
            "18446744073709551615m",
            "99999999999999999999999s", // does not fit u64
        ] {
            let err = parse_interval(absurd).unwrap_err();
            assert!(err.contains("longer than a day"), "{absurd}: {err}");
        }
    }

    #[test]
    fn the_accepted_forms_and_the_errors_are_exactly_these() {
        for (given, ms) in [
            ("0", 0),
            ("0s", 0),
            ("0ms", 0),
            ("0m", 0),
            ("00010s", 10_000),
            (" 10s ", 10_000),
            ("1500ms", 1_500),
            ("86400000ms", 86_400_000),
        ] {
            assert_eq!(
                parse_interval(given),
                Ok(Duration::from_millis(ms)),
                "{given}"
            );
        }
        let expected = |s: &str| format!("expected an interval like 10s, 500ms or 1m, got {s:?}");
        let unknown =
            |unit: &str, s: &str| format!("unknown unit {unit:?} in {s:?}: use ms, s or m");
        for (given, err) in [
            ("", expected("")),
            ("s", expected("s")),
            ("soon", expected("soon")),
            ("+5s", expected("+5s")),
            ("-1s", expected("-1s")),
            ("1h30m", unknown("h30m", "1h30m")),
            ("1h", unknown("h", "1h")),
            ("1d", unknown("d", "1d")),
            ("10 s", unknown(" s", "10 s")),
            ("10S", unknown("S", "10S")),
            ("1.5s", unknown(".5s", "1.5s")),
            ("500us", unknown("us", "500us")),
            ("10sec", unknown("sec", "10sec")),
            ("2min", unknown("min", "2min")),
            ("1m1m", unknown("m1m", "1m1m")),
            (
                "18446744073709551616",
                "\"18446744073709551616\" is longer than a day (1440m)".to_owned(),
            ),
            ("1441m", "\"1441m\" is longer than a day (1440m)".to_owned()),
        ] {
            assert_eq!(parse_interval(given), Err(err), "{given}");
        }
    }

    #[test]
    fn the_error_names_the_choices() {
        let e = "fast".parse::<Mode>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown value \"fast\" (expected one of: batched, per-message)"
        );
    }

    #[test]
    fn the_batching_default_is_the_products() {
        assert_eq!(Batching::default(), crate::pipeline::defaults::BATCHING);
        assert_eq!(Mode::default(), Mode::Batched);
    }
}
