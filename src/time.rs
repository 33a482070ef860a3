//! Timestamps: [`SystemTime`] in the API, RFC 3339 in UTC in JSON: whole
//! seconds in records (`2026-11-30T00:53:20Z`), milliseconds in events
//! (`2026-11-30T00:53:20.513Z`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `time` as RFC 3339 in UTC, to the second: `2026-11-30T00:53:20Z`.
/// Instants before 1970 are written as 1970-01-01T00:00:00Z.
pub fn to_rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}Z", date_and_time(since.as_secs()))
}

/// `time` as RFC 3339 in UTC, to the millisecond (truncated, always three
/// digits): `2026-11-30T00:53:20.513Z`. Instants before 1970 are written
/// as 1970-01-01T00:00:00.000Z.
pub fn to_rfc3339_millis(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!(
        "{}.{:03}Z",
        date_and_time(since.as_secs()),
        since.subsec_millis()
    )
}

/// `YYYY-MM-DDThh:mm:ss` of `secs` seconds since the Unix epoch, in UTC.
fn date_and_time(secs: u64) -> String {
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// Reads what [`to_rfc3339`] writes, and any RFC 3339 instant with a
/// `Z` or `±hh:mm` offset and optional fractional seconds (dropped).
pub fn from_rfc3339(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = text.get(19..)?;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest.as_bytes() {
        b"Z" | b"z" => 0,
        &[sign, h1, h2, b':', m1, m2] => {
            let sign = match sign {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (h, m) = (two_digits(h1, h2)?, two_digits(m1, m2)?);
            if h > 23 || m > 59 {
                return None;
            }
            sign * (h * 3_600 + m * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3_600 + min * 60 + sec - offset;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

/// The number two ASCII digits spell, or `None` for anything else. Works
/// on bytes, so text with multi-byte characters where digits belong is
/// refused rather than sliced inside a character.
fn two_digits(high: u8, low: u8) -> Option<i64> {
    (high.is_ascii_digit() && low.is_ascii_digit())
        .then(|| i64::from(high - b'0') * 10 + i64::from(low - b'0'))
}

/// Civil date from days since 1970-01-01 (proleptic Gregorian calendar;
/// Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Days since 1970-01-01 of a civil date (the inverse of
/// [`civil_from_days`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Serde for a [`SystemTime`] field as RFC 3339 text. Reading also
/// accepts a number of seconds since the Unix epoch, the form earlier
/// versions wrote.
pub mod rfc3339 {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use serde::{de, Deserialize, Deserializer, Serializer};

    /// Writes `time` as RFC 3339.
    pub fn serialize<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::to_rfc3339(*time))
    }

    /// Reads RFC 3339 text or seconds since the Unix epoch.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Secs(u64),
            Text(String),
        }
        match Either::deserialize(d)? {
            Either::Secs(secs) => Ok(UNIX_EPOCH + Duration::from_secs(secs)),
            Either::Text(text) => super::from_rfc3339(&text)
                .ok_or_else(|| de::Error::custom(format!("not an RFC 3339 time: {text:?}"))),
        }
    }
}

/// Serde for an `Option<SystemTime>` field as RFC 3339 text (`null` for
/// `None`), read as [`rfc3339`] reads.
pub mod rfc3339_opt {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `time` as RFC 3339, or `null`.
    pub fn serialize<S: Serializer>(time: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
        match time {
            Some(time) => super::rfc3339::serialize(time, s),
            None => s.serialize_none(),
        }
    }

    /// Reads RFC 3339 text (or seconds since the Unix epoch), or `null`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SystemTime>, D::Error> {
        #[derive(Deserialize)]
        struct Wrap(#[serde(with = "super::rfc3339")] SystemTime);
        Ok(Option::<Wrap>::deserialize(d)?.map(|w| w.0))
    }
}

/// Serde for a [`SystemTime`] field written as RFC 3339 with
/// milliseconds ([`to_rfc3339_millis`]): the `at` of every event.
pub mod rfc3339_millis {
    use std::time::{Duration, SystemTime};

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes `time` as RFC 3339 with milliseconds.
    pub fn serialize<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::to_rfc3339_millis(*time))
    }

    /// Reads what [`serialize`] writes, milliseconds included.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        let text = String::deserialize(d)?;
        let whole = super::from_rfc3339(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not an RFC 3339 time: {text:?}")))?;
        let millis = text
            .get(19..)
            .and_then(|rest| rest.strip_prefix('.'))
            .map(|digits| {
                let digits: String = digits
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .take(3)
                    .collect();
                format!("{digits:0<3}").parse::<u64>().unwrap_or(0)
            })
            .unwrap_or(0);
        Ok(whole + Duration::from_millis(millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn known_instants_format_and_read_back() {
        for (secs, text) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_796_000_000, "2026-11-30T00:53:20Z"),
        ] {
            assert_eq!(to_rfc3339(at(secs)), text);
            assert_eq!(from_rfc3339(text), Some(at(secs)));
        }
    }

    #[test]
    fn milliseconds_are_three_digits_truncated_and_read_back_to_the_second() {
        for (time, text) in [
            (at(0), "1970-01-01T00:00:00.000Z"),
            (
                at(1_796_000_000) + Duration::from_micros(513_999),
                "2026-11-30T00:53:20.513Z",
            ),
            (
                at(951_782_400) + Duration::from_millis(7),
                "2000-02-29T00:00:00.007Z",
            ),
            (
                UNIX_EPOCH - Duration::from_secs(1),
                "1970-01-01T00:00:00.000Z",
            ),
        ] {
            assert_eq!(to_rfc3339_millis(time), text);
        }
        assert_eq!(
            from_rfc3339("2026-11-30T00:53:20.513Z"),
            Some(at(1_796_000_000))
        );
    }

    #[test]
    fn offsets_and_fractions_read_and_nonsense_does_not() {
        assert_eq!(
            from_rfc3339("2000-02-29T01:30:00+01:30"),
            Some(at(951_782_400))
        );
        assert_eq!(
            from_rfc3339("2000-02-29T00:00:00.123Z"),
            Some(at(951_782_400))
        );
        for bad in [
            "",
            "2000-02-29",
            "2000-13-01T00:00:00Z",
            "2000-02-29T00:00:00",
            "x000-02-29T00:00:00Z",
            "2024-01-01T00:00:00+0éé",
            "2024-01-01T00:00:00+é:00",
            "2024-01-01T00:00:00é00:00",
            "2024-01-01T00:00:00+1:000",
            "2024-01-01T00:00:00+24:00",
            "2024-01-01T00:00:00+01:60",
            "2024-01-01T00:00:00+-1:00",
            "2024-01-01T00:00:00.é",
            "2024-01-01T00:00:0éZ",
        ] {
            assert_eq!(from_rfc3339(bad), None, "{bad}");
        }
    }
}
