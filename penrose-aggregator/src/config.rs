//! The data directory's layout and the server's configuration file.
//!
//! ```text
//! DATA/db/            RocksDB (every table)
//! DATA/server.key     ed25519 signing key for export bundles (0600), created on first use
//! DATA/server.key.pub its public half, hex, for the design server to pin
//! DATA/tls/cert.pem   the QUIC certificate agents pin (self-signed on first serve unless
//! DATA/tls/key.pem    tls_cert/tls_key name others), key 0600
//! DATA/control.sock   the admin channel while `serve` runs
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use penrose_host::data_dir::ServerDir;
use serde::Deserialize;
use thiserror::Error;

/// The configuration file (TOML); every key is optional and a command-line flag overrides it.
///
/// ```toml
/// data_dir = "/var/lib/penrose-aggregator"
/// listen = "127.0.0.1:4433"          # UDP, QUIC
/// public_key = "/etc/penrose/public.key"
/// token_keys = "/etc/penrose/token-keys"  # the issuer's exported key ring (0600); or instead
/// # open_admission = true                 # admit reports without tokens (anyone can report)
/// metrics = "127.0.0.1:9464"         # HTTP, Prometheus; omit to disable
/// tls_cert = "/etc/penrose/cert.pem" # default: DATA/tls/cert.pem, self-signed on first start
/// tls_key = "/etc/penrose/key.pem"
/// max_batch = 4096                   # reports per durable write
/// queue = 32768                      # valid reports waiting before `Overloaded`
/// max_connections = 10000
/// max_connections_per_source = 512   # per IPv4 address or IPv6 /64
/// new_connections_per_source_per_second = 500  # 0 for no limit
/// handshake_timeout = 5.0            # seconds; a slower handshake gives its slot back
/// reports_per_second = 5000          # per connection; 0 for no limit
/// udp_receive_buffer = 8388608       # bytes asked of the kernel (net.core.rmem_max caps it)
/// new_classes_per_hour = 1000        # beyond it, reports founding a class: retry later
/// epochs = "day"                     # or "reports:N"
/// threshold = 10                     # k contributors per released sum (at least 10)
/// reports_per_contributor = 24       # T, agents' reports per counter and day (at least 24)
/// keep_evidence = true               # keep reports' evidence for the release auditor
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// The data directory.
    pub data_dir: Option<PathBuf>,
    /// The QUIC listen address.
    pub listen: Option<SocketAddr>,
    /// The TCP address whose streams carry QUIC (Tor exits deliver agents' reports there).
    pub stream_listen: Option<SocketAddr>,
    /// The design server's Paillier public key file (one key for every day).
    pub public_key: Option<PathBuf>,
    /// The design server's signed key list file (keys that roll over).
    pub key_list: Option<PathBuf>,
    /// The design server's list-signing public key file.
    pub key_list_signer: Option<PathBuf>,
    /// The admission key ring file the issuer exported: reports are admitted by tokens.
    pub token_keys: Option<PathBuf>,
    /// Admit reports without tokens (must be said explicitly when `token_keys` is absent).
    pub open_admission: Option<bool>,
    /// The metrics listen address.
    pub metrics: Option<SocketAddr>,
    /// The TLS certificate file.
    pub tls_cert: Option<PathBuf>,
    /// The TLS key file.
    pub tls_key: Option<PathBuf>,
    /// Most reports per durable write.
    pub max_batch: Option<usize>,
    /// Valid reports waiting for the writer before new ones are answered `Overloaded`.
    pub queue: Option<usize>,
    /// Connections open at once.
    pub max_connections: Option<usize>,
    /// Connections one source (IPv4 address, IPv6 /64) may have open at once.
    pub max_connections_per_source: Option<usize>,
    /// New connections one source may open per second; 0 for no limit.
    pub new_connections_per_source_per_second: Option<u32>,
    /// Seconds a handshake may take before it is abandoned.
    pub handshake_timeout: Option<f64>,
    /// Classes founded per hour at most.
    pub new_classes_per_hour: Option<u32>,
    /// New report streams per connection per second; 0 for no limit.
    pub reports_per_second: Option<u32>,
    /// Bytes of UDP receive buffer to ask of the kernel (bursts wait there instead of being
    /// dropped).
    pub udp_receive_buffer: Option<usize>,
    /// How epochs are cut: `day` or `reports:N`.
    pub epochs: Option<String>,
    /// k contributors.
    pub threshold: Option<u64>,
    /// T reports per contributor per (counter, day).
    pub reports_per_contributor: Option<u32>,
    /// Keep every report's evidence for the release auditor.
    pub keep_evidence: Option<bool>,
}

/// Why the configuration could not be read.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A file was not read or written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
    /// The file is not valid TOML for this configuration (the message names key and line).
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What and where.
        source: Box<toml::de::Error>,
    },
}

impl FileConfig {
    /// Reads a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| {
            ConfigError::File(penrose_host::FileError::Io {
                path: path.to_path_buf(),
                source,
            })
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }
}

/// Paths inside a data directory: the layout every server shares
/// ([`penrose_host::data_dir::ServerDir`]: `db/`, `tls/`, `control.sock`), and the export
/// signing key.
#[derive(Clone, Debug)]
pub struct DataDir(ServerDir);

impl DataDir {
    /// The data directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DataDir(ServerDir::new(path))
    }

    /// The export signing key.
    pub fn signing_key(&self) -> PathBuf {
        self.0.file("server.key")
    }
}

impl std::ops::Deref for DataDir {
    type Target = ServerDir;

    fn deref(&self) -> &ServerDir {
        &self.0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\nmax_batch = 8\n").unwrap();
        let config = FileConfig::load(&path).unwrap();
        assert_eq!(config.max_batch, Some(8));
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\nmax_bach = 8\n").unwrap();
        let err = FileConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("max_bach") && err.contains("line 2"), "{err}");
        std::fs::write(&path, "listen = \"not an address\"\n").unwrap();
        let err = FileConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
    }

    /// The package's conffile (/etc/penrose/aggregator.toml) is a valid configuration, and its
    /// data directory is the one the systemd unit lets the server write (its StateDirectory).
    #[test]
    fn packaged_configuration_is_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/penrose-aggregator");
        let config = FileConfig::load(&dir.join("aggregator.toml")).unwrap();
        let data_dir = config.data_dir.unwrap();
        assert_eq!(data_dir, Path::new("/var/lib/penrose-aggregator"));
        assert!(config.public_key.is_some() && config.listen.is_some() && config.metrics.is_some());
        // The product admits by tokens: never open by default.
        assert!(config.token_keys.is_some() && config.open_admission.is_none());
        let unit = std::fs::read_to_string(dir.join("penrose-aggregator.service")).unwrap();
        assert!(
            unit.lines()
                .any(|l| l == "StateDirectory=penrose-aggregator")
        );
        assert!(
            unit.lines()
                .any(|l| l == "ExecStart=/usr/bin/penrose-aggregator serve --config /etc/penrose/aggregator.toml")
        );
    }
}
