//! The exit codes every Penrose binary uses, so that a script, a test or a systemd unit reads
//! one table instead of one per tier.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | success |
//! | 1 | failure: anything not below (I/O, a peer that did not answer, a bug) |
//! | 2 | usage: the command line is wrong (clap's own code) |
//! | 3 | refused: an input was checked and refused (a configuration file, a report, a bundle, a key, a share, a label, a request) |
//! | 4 | unavailable: the host cannot do it now (a capture prerequisite is missing, another process holds the data directory) |
//!
//! 3 is a verdict on what the caller gave, 4 on the machine; retrying helps with neither
//! without a change, which is why the agent's unit stops restarting on both.

use std::fmt::Display;
use std::process::ExitCode;

/// One row of the table above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// 0.
    Success = 0,
    /// 1: any failure that is not a refusal or an unavailable host.
    Failure = 1,
    /// 2: the command line is wrong (clap exits with it before any of our code runs).
    Usage = 2,
    /// 3: an input was checked and refused.
    Refused = 3,
    /// 4: the host lacks something the command needs, or another process holds it.
    Unavailable = 4,
}

impl Exit {
    /// The number the process exits with.
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> Self {
        ExitCode::from(exit.code())
    }
}

/// Ends a binary's `main`: prints an error as `error: ...` on stderr (its whole chain, with
/// `{:#}`) and exits with the code `classify` gives it, or with the code a success carries.
/// One place, so that every binary prints failures the same way.
pub fn finish<T: Into<ExitCode>, E: Display>(
    result: Result<T, E>,
    classify: impl FnOnce(&E) -> Exit,
) -> ExitCode {
    match result {
        Ok(done) => done.into(),
        Err(e) => {
            eprintln!("error: {e:#}");
            classify(&e).into()
        }
    }
}

/// The multi-threaded runtime the servers run on, built the same way in every binary.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_the_one_the_docs_give() {
        let codes: Vec<u8> = [
            Exit::Success,
            Exit::Failure,
            Exit::Usage,
            Exit::Refused,
            Exit::Unavailable,
        ]
        .iter()
        .map(|e| e.code())
        .collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn an_error_exits_with_its_class_and_a_success_with_its_own_code() {
        let refused: Result<Exit, String> = Err("no".into());
        assert_eq!(
            finish(refused, |_| Exit::Refused),
            ExitCode::from(Exit::Refused.code())
        );
        let ok: Result<Exit, String> = Ok(Exit::Success);
        assert_eq!(finish(ok, |_| Exit::Failure), ExitCode::SUCCESS);
    }
}
