//! Typed failures of the Tor route.

use std::path::PathBuf;

use thiserror::Error;

/// Why the Tor route could not be set up or used.
#[derive(Debug, Error)]
pub enum TorError {
    /// No network was named: the public Tor network is only used when a configuration says
    /// `public` in so many words.
    #[error("no Tor network configured: say \"public\" or give an arti network file")]
    NoNetwork,
    /// The network file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The network file is not arti configuration TOML.
    #[error("{path}: not an arti configuration: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// A private network file that would leave some of arti's built-in public relays or
    /// authorities in place: arti would then try the public Tor network.
    #[error(
        "{path}: a private network must replace both tor_network.fallback_caches and \
         tor_network.authorities ({missing} missing or empty); otherwise arti would use its \
         built-in public relays"
    )]
    NotReplaced {
        /// The file.
        path: PathBuf,
        /// The key that is missing or empty.
        missing: &'static str,
    },
    /// The network file tries to choose where arti keeps its state; the agent does.
    #[error("{path}: `storage` is set by the agent (its state directory), not the network file")]
    StorageInNetworkFile {
        /// The file.
        path: PathBuf,
    },
    /// arti refused the configuration.
    #[error("arti configuration: {0}")]
    Config(String),
    /// The state directory could not be made.
    #[error("{path}: {source}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// arti could not start, bootstrap or open a stream.
    #[error("tor: {0}")]
    Arti(#[from] arti_client::Error),
}
