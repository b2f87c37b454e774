//! Days as people write them: `YYYY-MM-DD` dates (proleptic Gregorian, UTC) and the
//! command-line forms `today`, `today+N`, `today-N`, a date or a day number, shared by every
//! tier's CLI that takes a day (the issuer's key export, the design server's key list).

use std::str::FromStr;

use crate::wire::Day;

/// A day as `YYYY-MM-DD` (proleptic Gregorian, UTC).
pub fn date_of(day: Day) -> String {
    // Howard Hinnant's civil_from_days.
    let z = i64::from(day.0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day of a `YYYY-MM-DD` date; `None` for anything else or a date before 1970.
pub fn day_of_date(text: &str) -> Option<Day> {
    let mut parts = text.split('-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, i64, i64) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let day = Day(u32::try_from(days).ok()?);
    // Refuse dates that do not exist (2026-02-30) rather than roll them over.
    (date_of(day) == text).then_some(day)
}

/// A day on the command line: `today`, `today+N`, `today-N`, a date `YYYY-MM-DD`, or a day
/// number (days since 1970-01-01).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DaySpec {
    /// Today plus (or minus) some days.
    Today(i64),
    /// A fixed day.
    Fixed(Day),
}

impl DaySpec {
    /// The day this names on `today` (clamped to the representable days).
    pub fn resolve(self, today: Day) -> Day {
        match self {
            DaySpec::Today(offset) => {
                let day = i64::from(today.0).saturating_add(offset);
                Day(u32::try_from(day.max(0)).unwrap_or(u32::MAX))
            }
            DaySpec::Fixed(day) => day,
        }
    }
}

impl FromStr for DaySpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{text:?} is not a day: use today, today+N, today-N, YYYY-MM-DD or a day number"
            )
        };
        if let Some(rest) = text.strip_prefix("today") {
            if rest.is_empty() {
                return Ok(DaySpec::Today(0));
            }
            let (sign, digits) = rest.split_at_checked(1).ok_or_else(bad)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let n: i64 = digits.parse().map_err(|_| bad())?;
            return match sign {
                "+" => Ok(DaySpec::Today(n)),
                "-" => Ok(DaySpec::Today(-n)),
                _ => Err(bad()),
            };
        }
        if text.contains('-') {
            return day_of_date(text).map(DaySpec::Fixed).ok_or_else(bad);
        }
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse::<u32>()
                .map(|d| DaySpec::Fixed(Day(d)))
                .map_err(|_| bad());
        }
        Err(bad())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_and_impossible_ones_are_refused() {
        assert_eq!(date_of(Day(0)), "1970-01-01");
        assert_eq!(date_of(Day(20_423)), "2025-12-01");
        for day in [0, 59, 60, 365, 11_016, 20_423, 20_513, 40_000] {
            assert_eq!(day_of_date(&date_of(Day(day))), Some(Day(day)));
        }
        for bad in [
            "2026-02-30",
            "2026-13-01",
            "1969-12-31",
            "2026-1-01",
            "x",
            "2026-01-01-1",
        ] {
            assert_eq!(day_of_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn days_parse_in_every_form() {
        let today = Day(20_000);
        for (text, day) in [
            ("today", 20_000),
            ("today+7", 20_007),
            ("today-2", 19_998),
            ("2024-10-04", 20_000),
            ("2026-12-02", 20_789),
            ("20000", 20_000),
        ] {
            assert_eq!(
                text.parse::<DaySpec>().unwrap().resolve(today),
                Day(day),
                "{text}"
            );
        }
        for bad in [
            "today+",
            "today*2",
            "tomorrow",
            "",
            "2024-02-30",
            "-1",
            "today+-1",
        ] {
            assert!(bad.parse::<DaySpec>().is_err(), "{bad}");
        }
    }
}
