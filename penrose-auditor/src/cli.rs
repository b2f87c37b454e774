//! The `penrose-auditor` command line: its clap definition, here in the library so that the
//! binary parses it and man pages and completions can be rendered from it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};
use penrose_core::bundle::InstanceId;
use penrose_core::release::{DEFAULT_CAP, MIN_CONTRIBUTORS};

use crate::data_dir::DataDir;

/// The clap command `penrose-auditor` parses.
pub fn command() -> clap::Command {
    Cli::command()
}

/// The Penrose release auditor: holds the second share of the design server's split Paillier
/// key, and gives its partial decryption of a released sum, without which the design server
/// decrypts nothing, only after checks of its own.
///
/// The design server forwards each bundle of the aggregation server's chain, exactly as
/// signed, and asks for a page of its sums at a time. The auditor answers only a bundle
/// signed by the aggregation server it pins, of the one chain it follows, in chain order,
/// none of whose epochs it answered in another bundle (under any chain), and decrypts only
/// the sums its own threshold releases (at least --threshold contributors, counted as reports
/// / (--cap x days)); the others it withholds. It records each bundle, durably, before any
/// partial leaves. Run it where the vendor's operators cannot reach, ideally by another
/// party: its refusals are what the split is for.
///
/// Set up once with `init` (from the files the dealer hands over: the auditor's share, the
/// public key, the verification key, and the aggregation server's signing key's .pub file),
/// then `serve`. The design server pins the certificate `serve` creates (DATA/tls/cert.pem).
///
/// Exit codes (every Penrose binary's): 0 success, 1 error, 2 usage, 3 refused (a share that is not the auditor's or
/// not of the public key given, a key under 2048 bits, a threshold under the floor, a data
/// directory that exists, a key already held), 4 unavailable: the data directory is in use (stop `serve`
/// before `add-share` or `follow`).
#[derive(Parser)]
#[command(name = "penrose-auditor", version, about, long_about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The data directory.
#[derive(clap::Args, Clone, Debug)]
pub struct DataArg {
    /// The data directory: key shares, pinned key, policy, record, TLS identity.
    #[arg(long, short = 'd', default_value = "/var/lib/penrose-auditor")]
    pub data: PathBuf,
}

impl DataArg {
    /// The data directory.
    pub fn dir(&self) -> DataDir {
        DataDir::new(self.data.clone())
    }
}

/// The files of one key the dealer hands over.
#[derive(clap::Args, Clone, Debug)]
pub struct KeyFiles {
    /// The auditor's share of the key (`auditor.share`; mode 0600, refused if group or others
    /// can read it). Copied into the data directory: delete the original once backed up.
    #[arg(long)]
    pub share: PathBuf,
    /// The public key the share belongs to (`public.key`).
    #[arg(long)]
    pub public_key: PathBuf,
    /// The dealing's verification key (`verification.key`).
    #[arg(long)]
    pub verification_key: PathBuf,
}

/// The subcommands (each variant's doc comment is its help text).
#[derive(Subcommand)]
pub enum Command {
    /// Create the data directory (0700) from the dealer's files and the aggregation server's
    /// key.
    ///
    /// Refuses a share that is not the auditor's (the design server's must never be on the
    /// same machine), a share or verification key of another key, a key under 2048 bits, a
    /// threshold or cap under the floors, and a data directory that exists and is not empty;
    /// then nothing is written. Without --instance the auditor follows the chain of the first
    /// bundle it is sent (unless that chain is a restored copy's, which only `follow` pins).
    /// Example:
    ///   penrose-auditor init --data /var/lib/penrose-auditor --share auditor.share
    ///     --public-key public.key --verification-key verification.key
    ///     --aggregator-key aggregator-signing.key.pub
    Init {
        /// The data directory.
        #[command(flatten)]
        data: DataArg,
        /// The key's files.
        #[command(flatten)]
        key: KeyFiles,
        /// The aggregation server's bundle-signing public key: the .pub file beside its
        /// signing key (64 hex digits).
        #[arg(long)]
        aggregator_key: PathBuf,
        /// Follow only this chain (the aggregation server store's instance id, 32 hex
        /// digits) from its first bundle on.
        #[arg(long)]
        instance: Option<InstanceId>,
        /// The fewest contributors a sum must have for the auditor to decrypt it (at least
        /// the floor, 10).
        #[arg(long, default_value_t = MIN_CONTRIBUTORS)]
        threshold: u64,
        /// The reports one contributor may send per counter and day, which contributors are
        /// counted with (at least the agents' cap, 24).
        #[arg(long, default_value_t = DEFAULT_CAP)]
        cap: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add a share of a further key (a key rollover: a bundle's sums may be under the old key
    /// and the new one during the grace days).
    ///
    /// The same checks as `init`; refuses a key already held. The auditor must be stopped
    /// (exit code 4 otherwise); it loads its shares when it starts. Example:
    ///   penrose-auditor add-share --data /var/lib/penrose-auditor --share next/auditor.share
    ///     --public-key next/public.key --verification-key next/verification.key
    AddShare {
        /// The data directory.
        #[command(flatten)]
        data: DataArg,
        /// The key's files.
        #[command(flatten)]
        key: KeyFiles,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the auditor: a QUIC endpoint (ALPN penrose-auditor/1) answering the design
    /// server's requests for partial decryptions and its chain position.
    ///
    /// On first start it makes a self-signed TLS certificate (DATA/tls/cert.pem, key 0600)
    /// for the design server to pin, unless --cert and --key name others. It prints one JSON
    /// line (listening, certificate, instance, seq, keys), then logs to stderr (RUST_LOG);
    /// SIGINT/SIGTERM stop it once the answers in flight are done. Example:
    ///   penrose-auditor serve --data /var/lib/penrose-auditor --listen 0.0.0.0:4435
    Serve {
        /// The data directory.
        #[command(flatten)]
        data: DataArg,
        /// QUIC listen address (UDP).
        #[arg(long, default_value = crate::service::DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// TLS certificate (PEM or DER) [default: DATA/tls/cert.pem, self-signed on first
        /// start].
        #[arg(long, requires = "key")]
        cert: Option<PathBuf>,
        /// TLS private key (PEM or DER) of --cert.
        #[arg(long, requires = "cert")]
        key: Option<PathBuf>,
        /// Another name for the self-signed certificate (repeatable; localhost and the listen
        /// address are always in it).
        #[arg(long)]
        name: Vec<String>,
    },
    /// Where the auditor stands: the chain it follows, its last bundle, every epoch it
    /// answered, the keys it holds a share of, its release rule. Works while it serves.
    Status {
        /// The data directory.
        #[command(flatten)]
        data: DataArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Re-pin the chain followed: the aggregation server's store was restored from a backup
    /// or copied (a new instance, naming its parent), and its operator says why.
    ///
    /// Every epoch answered before stays answered: the new chain's bundles that release one
    /// again are refused. The auditor takes the new chain from its first bundle (or where it
    /// left it, if it followed it before). The auditor must be stopped (exit code 4
    /// otherwise). Logged. Example:
    ///   penrose-auditor follow --data /var/lib/penrose-auditor --instance 3f9a...
    Follow {
        /// The data directory.
        #[command(flatten)]
        data: DataArg,
        /// The chain to follow (32 hex digits).
        #[arg(long)]
        instance: InstanceId,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        command().debug_assert();
    }
}
