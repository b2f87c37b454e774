//! How a decrypted counter's values read: the catalogue's binning its bins lie on, and values
//! written with their unit. The report's tables and CSV, the joint views' descriptions and
//! the plots all read them the same way, so they live here, apart from any one view.

use penrose_core::counters::{Binning, Catalogue, CatalogueVersion, CounterId};

use crate::report::CounterReport;

/// A value with its unit, to three significant digits, scaled to a readable prefix (ns to
/// µs, ms, s; bytes to kB, MB, GB; counts to k, M, G).
pub fn human(value: f64, unit: &str) -> String {
    if !value.is_finite() {
        return "-".to_string();
    }
    let sig = |v: f64| {
        let a = v.abs();
        if a >= 100.0 || a == 0.0 {
            format!("{v:.0}")
        } else if a >= 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    };
    let scaled = |v: f64, steps: [&str; 4], space: &str| {
        let a = v.abs();
        let (d, p) = if a >= 1e9 {
            (1e9, steps[3])
        } else if a >= 1e6 {
            (1e6, steps[2])
        } else if a >= 1e3 {
            (1e3, steps[1])
        } else {
            (1.0, steps[0])
        };
        format!("{}{space}{p}", sig(v / d))
    };
    match unit {
        "ns" => scaled(value, ["ns", "µs", "ms", "s"], " "),
        "B" => scaled(value, ["B", "kB", "MB", "GB"], " "),
        "%" => format!("{}%", sig(value)),
        "" => scaled(value, ["", "k", "M", "G"], ""),
        other => format!("{} {other}", sig(value)),
    }
}

/// The catalogue's binning of a decrypted counter (`None` for a counter it does not know).
pub fn binning(c: &CounterReport) -> Option<Binning> {
    Catalogue::by_version(CatalogueVersion(c.catalogue))
        .and_then(|cat| cat.counter(CounterId(c.counter)))
        .map(|k| k.binning)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_with_their_units() {
        assert_eq!(human(1500.0, "ns"), "1.50 µs");
        assert_eq!(human(2.5e7, "ns"), "25.0 ms");
        assert_eq!(human(512.0, "B"), "512 B");
        assert_eq!(human(3.0e9, "B"), "3.00 GB");
        assert_eq!(human(42.25, "%"), "42.2%");
        assert_eq!(human(12_345.0, ""), "12.3k");
        assert_eq!(human(f64::NAN, "ns"), "-");
    }
}
