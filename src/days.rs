//! Days, UUIDv7 timestamps and partition bounds: pure arithmetic, no I/O.
//!
//! A UUIDv7 starts with its creation time: 48 bits of Unix milliseconds, big-endian. PostgreSQL
//! orders `uuid` values bytewise, so the ids created during one UTC day form one contiguous range,
//! from the UUID whose first 48 bits are the day's first millisecond and whose other bits are zero
//! (inclusive) to the same UUID of the next day (exclusive). Those are the partition bounds.
//!
//! The calendar is `jiff`'s and a UUIDv7's time `uuid`'s to read; the bounds are built here: no
//! crate makes the smallest UUID of a millisecond, which is not itself a UUIDv7 (its version and
//! variant bits are zero).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::civil::Date;
use jiff::Span;
use uuid::{Uuid, Version};

/// Milliseconds in a day.
pub(crate) const DAY_MS: i64 = 86_400_000;

/// The creation time of a UUIDv7 in Unix milliseconds; `None` for any other version (a UUIDv4
/// carries no time).
pub(crate) fn v7_millis(id: &Uuid) -> Option<i64> {
    // `get_timestamp` also reads the times of versions 1 and 6, which are not partition times.
    if id.get_version() != Some(Version::SortRand) {
        return None;
    }
    let (seconds, nanos) = id.get_timestamp()?.to_unix();
    // 48 bits of milliseconds: always an i64.
    i64::try_from(seconds * 1000 + u64::from(nanos / 1_000_000)).ok()
}

/// The smallest UUID whose first 48 bits are `ms` (clamped to the 48-bit range).
pub(crate) fn uuid_at_millis(ms: i64) -> Uuid {
    let ms = ms.clamp(0, (1i64 << 48) - 1) as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

/// Unix milliseconds of `t` (negative before 1970).
pub fn unix_millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// `t - d`, saturating at the epoch.
pub(crate) fn before(t: SystemTime, d: Duration) -> SystemTime {
    t.checked_sub(d).unwrap_or(UNIX_EPOCH).max(UNIX_EPOCH)
}

/// The UTC day (days since 1970-01-01) that contains Unix millisecond `ms`.
pub fn day_of_millis(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// The range of ids of day `day`: `[from, to)` (saturating: days beyond the 48-bit range of a
/// UUIDv7's time clamp to its ends).
pub fn day_bounds(day: i64) -> (Uuid, Uuid) {
    (
        uuid_at_millis(day.saturating_mul(DAY_MS)),
        uuid_at_millis(day.saturating_add(1).saturating_mul(DAY_MS)),
    )
}

/// The first day of the calendar, 1970-01-01: day 0.
const EPOCH: Date = Date::constant(1970, 1, 1);

/// The name of day `day`'s partition: `inbox_pYYYYMMDD`.
///
/// # Panics
///
/// When the day is not in the years -9999 to 9999 (`jiff`'s calendar); no partition of such a day
/// could be found again by its name, which holds four digits of year.
pub fn partition_name(day: i64) -> String {
    let date = Span::new()
        .try_days(day)
        .and_then(|days| EPOCH.checked_add(days))
        .unwrap_or_else(|e| panic!("no partition name for day {day}: {e}"));
    let (y, m, d) = (date.year(), date.month(), date.day());
    format!("inbox_p{y:04}{m:02}{d:02}")
}

/// The day of a partition named `inbox_pYYYYMMDD`; `None` for any other name.
pub(crate) fn day_of_partition(name: &str) -> Option<i64> {
    let digits = name.strip_prefix("inbox_p")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let y: i16 = digits[..4].parse().ok()?;
    let m: i8 = digits[4..6].parse().ok()?;
    let d: i8 = digits[6..].parse().ok()?;
    let date = Date::new(y, m, d).ok()?;
    Some(i64::from(date.since(EPOCH).ok()?.get_days()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v7_id_carries_its_millisecond_and_a_v4_id_none() {
        let t = UNIX_EPOCH + Duration::from_millis(1_764_460_800_123);
        let ts = uuid::Timestamp::from_unix(uuid::NoContext, 1_764_460_800, 123_000_000);
        let id = Uuid::new_v7(ts);
        assert_eq!(v7_millis(&id), Some(unix_millis(t)));
        assert_eq!(v7_millis(&Uuid::new_v4()), None);
    }

    #[test]
    fn a_days_ids_lie_between_its_bounds() {
        let day = day_of_millis(1_764_460_800_123);
        let (from, to) = day_bounds(day);
        assert_eq!(from.to_string(), "019ad20f-2800-0000-0000-000000000000");
        let first = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_764_460_800,
            0,
        ));
        let last = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_764_547_199,
            999_000_000,
        ));
        assert!(from <= first && last < to, "{from} {first} {last} {to}");
        assert_eq!(day_bounds(day + 1).0, to);
        let max = uuid_at_millis((1 << 48) - 1);
        assert_eq!(day_bounds(i64::MAX), (max, max));
        assert_eq!(day_bounds(i64::MIN), (Uuid::nil(), Uuid::nil()));
    }

    #[test]
    fn v7_times_are_read_from_the_first_48_bits_of_version_7_only() {
        let with = |hex: &str| Uuid::parse_str(hex).unwrap();
        assert_eq!(
            v7_millis(&with("00000000-0000-7000-8000-000000000000")),
            Some(0)
        );
        assert_eq!(
            v7_millis(&with("ffffffff-ffff-7fff-bfff-ffffffffffff")),
            Some((1 << 48) - 1)
        );
        assert_eq!(
            v7_millis(&with("019ad20f-287b-7000-8000-000000000000")),
            Some(1_764_460_800_123)
        );
        // The version is what counts, not the variant.
        assert_eq!(
            v7_millis(&with("019ad20f-287b-7000-0000-000000000000")),
            Some(1_764_460_800_123)
        );
        // Other versions carry no UUIDv7 time, including the ones with a time of their own.
        for other in [
            "00000000-0000-0000-0000-000000000000", // nil
            "ffffffff-ffff-ffff-ffff-ffffffffffff", // max
            "019ad20f-287b-1000-8000-000000000000", // v1
            "019ad20f-287b-6000-8000-000000000000", // v6
            "019ad20f-287b-4000-8000-000000000000", // v4
            "019ad20f-287b-8000-8000-000000000000", // v8
        ] {
            assert_eq!(v7_millis(&with(other)), None, "{other}");
        }
    }

    #[test]
    fn partition_names_on_edge_days() {
        for (day, name) in [
            (-719_528, "inbox_p00000101"), // year 0, a leap year
            (-719_469, "inbox_p00000229"),
            (-719_468, "inbox_p00000301"),
            (-25_509, "inbox_p19000228"), // 1900 is not a leap year
            (-25_508, "inbox_p19000301"),
            (-1, "inbox_p19691231"),
            (0, "inbox_p19700101"),
            (11_016, "inbox_p20000229"), // 2000 is one
            (19_782, "inbox_p20240229"),
            (47_540, "inbox_p21000228"), // 2100 is not
            (47_541, "inbox_p21000301"),
            (2_932_896, "inbox_p99991231"),
        ] {
            assert_eq!(partition_name(day), name, "{day}");
            assert_eq!(day_of_partition(name), Some(day), "{name}");
        }
        for bad in [
            "inbox_p19000229",
            "inbox_p21000229",
            "inbox_p20250229",
            "inbox_p20250230",
            "inbox_p20250431",
            "inbox_p20250000",
            "inbox_p20250001",
            "inbox_p20250100",
            "inbox_p20251232",
            "inbox_p99999999",
            "inbox_p+2025010",
            "inbox_p-0010101",
            "inbox_p100000101",
            "inbox_p２０２５0101",
        ] {
            assert_eq!(day_of_partition(bad), None, "{bad}");
        }
    }

    #[test]
    #[should_panic(expected = "no partition name for day 2932897")]
    fn a_day_after_year_9999_has_no_partition_name() {
        partition_name(2_932_897);
    }

    #[test]
    #[should_panic(expected = "no partition name for day -4371588")]
    fn a_day_before_year_minus_9999_has_no_partition_name() {
        partition_name(-4_371_588);
    }

    #[test]
    fn partition_names_round_trip_through_dates() {
        assert_eq!(partition_name(0), "inbox_p19700101");
        assert_eq!(partition_name(20_422), "inbox_p20251130");
        assert_eq!(
            partition_name(day_of_millis(951_782_400_000)),
            "inbox_p20000229"
        );
        for day in [-1, 0, 59, 10_956, 20_422, 40_000] {
            assert_eq!(day_of_partition(&partition_name(day)), Some(day));
        }
        for bad in [
            "inbox_default",
            "inbox_p2025120",
            "inbox_p20251301",
            "inbox_p2025023x",
        ] {
            assert_eq!(day_of_partition(bad), None, "{bad}");
        }
    }
}
