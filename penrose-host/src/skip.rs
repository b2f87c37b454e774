//! How a test or a check that cannot run on this machine says so: one line starting with
//! `SKIPPED`, written to the process's own stderr. libtest captures `println!` and `eprintln!`
//! of a passing test, so a skip said through them would pass in silence; CI counts these lines
//! in its summary (ci/test.sh), so a skip is never mistaken for a pass.

use std::io::Write as _;

/// Writes `line` (which starts with `SKIPPED`, then why) to stderr, past libtest's capture.
pub fn skipped(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
