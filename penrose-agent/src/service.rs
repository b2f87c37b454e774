//! The agent as a service (`penrose-agent run`): the process around [`crate::daemon::run`].
//! It honours `enabled = false`, drops the capabilities capture does not need before any
//! thread exists, turns SIGINT and SIGTERM into the daemon's stop flag, and runs the daemon on
//! a small async runtime until it stops.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::config::AgentConfig;
use crate::daemon::{DaemonError, RunOutcome};
use crate::privilege::PrivilegeError;

/// How often the signal flag is looked at.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Why the service could not run, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Running as root, the capabilities capture does not need could not be dropped.
    #[error("dropping the capabilities capture does not need")]
    Capabilities(#[source] PrivilegeError),
    /// The SIGINT/SIGTERM handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// The async runtime did not start.
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    /// The daemon could not start or had to stop.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
}

impl ServiceError {
    /// A host prerequisite of the live capture is missing (not root, no BTF, ...): exit
    /// code 4 (unavailable), which restarting does not heal.
    pub fn is_missing_prerequisite(&self) -> bool {
        matches!(self, Self::Daemon(e) if e.is_missing_prerequisite())
    }
}

/// Runs the daemon configured by `config` (loaded from `config_path`, which the log names)
/// until SIGINT or SIGTERM; with `enabled = false`, logs one line and returns
/// [`RunOutcome::Disabled`] without capturing, creating the state directory or sending.
pub fn serve(config_path: &Path, config: AgentConfig) -> Result<RunOutcome, ServiceError> {
    if !config.enabled {
        tracing::info!(
            "penrose-agent is disabled by {} (enabled = false): nothing is captured or sent",
            config_path.display()
        );
        return Ok(RunOutcome::Disabled);
    }
    // Before any thread exists: capabilities are per thread, and threads inherit them.
    if crate::capture::loader::is_root() {
        let kept = crate::privilege::keep_only_capture_capabilities()
            .map_err(ServiceError::Capabilities)?;
        tracing::info!(
            "capabilities: kept {:#x} (BPF, PERFMON, SYS_ADMIN, SYS_PTRACE, DAC_READ_SEARCH), \
             {} removed from the bounding set, no_new_privs set",
            kept.permitted,
            kept.dropped_from_bounding
        );
    }
    let signals = penrose_host::process::stop_on_signals().map_err(ServiceError::Signals)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServiceError::Runtime)?;
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = runtime.block_on(async {
        let watcher = {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !signals.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(SIGNAL_POLL).await;
                }
                stop.store(true, Ordering::Relaxed);
            })
        };
        let r = crate::daemon::run(config, stop.clone()).await;
        stop.store(true, Ordering::Relaxed);
        let _ = watcher.await;
        r
    })?;
    if let RunOutcome::Stopped(status) = &outcome {
        tracing::info!(
            "stopped: {} windows, {} histograms sealed, {} delivered, {} still spooled",
            status.windows,
            status.pipeline.sealed,
            status.uploads.accepted + status.uploads.duplicate,
            status.spool.reports
        );
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `enabled = false`: nothing runs, nothing is created, and no handler or capability
    /// changes (those come after the check).
    #[test]
    fn a_disabled_agent_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("state");
        let config = AgentConfig {
            enabled: false,
            state_dir: state_dir.clone(),
            ..AgentConfig::default()
        };
        let outcome = serve(Path::new("agent.toml"), config).unwrap();
        assert!(matches!(outcome, RunOutcome::Disabled));
        assert!(!state_dir.exists());
    }

    #[test]
    fn only_a_missing_capture_prerequisite_is_unavailable() {
        let setup = ServiceError::Daemon(DaemonError::Setup("no key".into()));
        assert!(!setup.is_missing_prerequisite());
        assert_eq!(setup.to_string(), "no key");
        let signals = ServiceError::Signals(std::io::Error::other("refused"));
        assert!(!signals.is_missing_prerequisite());
        assert_eq!(signals.to_string(), "installing signal handlers");
    }
}
