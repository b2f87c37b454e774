//! Writes an admission key ring for tests and benchmarks (test equipment: the issuer service
//! exports the real ones): fresh issuer keys of every counter of the current catalogue for the
//! days from today - BEFORE to today + AFTER (days since 1970, the token epochs), mode 0600.
//!
//! ```text
//! cargo run --release -p penrose-aggregator --example token_keys -- OUT [BEFORE [AFTER]]
//! ```
//!
//! BEFORE and AFTER default to 1: yesterday, today and tomorrow, the days a report may have.
//! Give the same file to `serve --token-keys` and `loadgen --token-keys`.

use anyhow::{Context, Result};
use penrose_aggregator::admission::{test_equipment_key_ring, write_key_ring};
use penrose_core::wire::Day;
use penrose_host::clock::today;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let out = args
        .next()
        .context("usage: token_keys OUT [BEFORE [AFTER]]")?;
    let before: u32 = args.next().map_or(Ok(1), |a| a.parse())?;
    let after: u32 = args.next().map_or(Ok(1), |a| a.parse())?;
    let day = today();
    let (first, last) = (
        Day(day.0.saturating_sub(before)),
        Day(day.0.saturating_add(after)),
    );
    let ring = test_equipment_key_ring(first, last)?;
    write_key_ring(out.as_ref(), &ring)?;
    println!(
        "{out}: {} keys, epochs {} to {}",
        ring.keys().len(),
        first.0,
        last.0
    );
    Ok(())
}
