//! Settings that take one of a few names (`batched`, `per-message`): parsed from and shown as
//! text by the library itself, so that no command-line library is part of its types.

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
    use crate::batcher::Batching;
    use crate::inbox::Mode;
    use crate::logging::LogFormat;

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
        round_trip::<LogFormat>();
        assert_eq!(Mode::NAMES, ["batched", "per-message"]);
        assert_eq!(Batching::NAMES, ["linger", "natural"]);
        assert_eq!(LogFormat::NAMES, ["text", "json"]);
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
        assert_eq!(Batching::default(), crate::defaults::BATCHING);
        assert_eq!(Mode::default(), Mode::Batched);
    }
}
