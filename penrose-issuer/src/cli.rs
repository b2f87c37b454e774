//! The `penrose-issuer` command line: its clap definition, here in the library so that the
//! binary parses it and `cargo xtask dist` renders man pages and shell completions from it.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgGroup, CommandFactory, Parser, Subcommand};

use crate::issuer::DEFAULT_REQUESTS_PER_HOUR;
use crate::state::StateDir;

/// The clap command `penrose-issuer` parses (man pages and completions are made from it).
pub fn command() -> clap::Command {
    Cli::command()
}

/// The Penrose token issuer: enrols hosts and gives each enrolled host at most T = 24 blinded
/// admission tokens per day and counter, so that the aggregation server admits reports of
/// enrolled agents only, at a bounded rate, without anyone being able to tell which host a
/// token was issued to.
///
/// Set up once with `init`, enrol hosts with `enrol` (one credential file per host, installed
/// with the agent), hand the aggregation server its verification keys with `export-keys`, and
/// run `serve`. Keys are derived per day and counter from the master seed `init` creates
/// (STATE/seed): nothing rotates by hand, but export key rings ahead of time and back up the
/// seed.
///
/// `enrol`, `revoke` and `status` work whether or not the issuer is serving: they use its
/// control socket (STATE/control.sock) when it runs and open the store themselves otherwise.
///
/// Exit codes: 0 success, 1 error, 2 usage, 3 refused (revoke: no credential has that id, or
/// several do; a bad label).
#[derive(Parser)]
#[command(version, about, long_about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The state directory.
#[derive(clap::Args, Clone, Debug)]
pub struct StateArg {
    /// The state directory: master seed, store, TLS identity, control socket.
    #[arg(long, short = 's', default_value = "/var/lib/penrose-issuer")]
    pub state: PathBuf,
}

impl StateArg {
    /// The state directory.
    pub fn dir(&self) -> StateDir {
        StateDir::new(self.state.clone())
    }
}

pub use penrose_core::calendar::DaySpec;

/// The subcommands (each variant's doc comment is its help text).
#[derive(Subcommand)]
pub enum Command {
    /// Create the state directory: a new master seed (STATE/seed, 32 random bytes, mode 0600)
    /// and an empty store (STATE/db).
    ///
    /// Every issuer key derives from the seed: back it up where only the issuer's operators can
    /// read it. Refuses a state directory that already has a seed or a store. Example:
    ///   penrose-issuer init --state /var/lib/penrose-issuer
    Init {
        /// The state directory.
        #[command(flatten)]
        state: StateArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Enrol hosts: write one credential file per host (mode 0600) and record the credential's
    /// id (a hash; the issuer never keeps the secret).
    ///
    /// Install the file with the agent on that host (the agent's configuration names it);
    /// whoever holds it gets that host's tokens. Prints each credential's short id, which
    /// `revoke` takes. One host: `--out FILE`; a fleet: `--count N --out-dir DIR` (files
    /// DIR/SHORT_ID.credential). Examples:
    ///   penrose-issuer enrol --state /var/lib/penrose-issuer --out gpu17.credential --label gpu17
    ///   penrose-issuer enrol --state /var/lib/penrose-issuer --count 500 --out-dir fleet/
    #[command(group(ArgGroup::new("target").required(true).args(["out", "out_dir"])))]
    Enrol {
        /// The state directory.
        #[command(flatten)]
        state: StateArg,
        /// Write one host's credential to FILE (never overwritten).
        #[arg(long, conflicts_with_all = ["count", "out_dir"])]
        out: Option<PathBuf>,
        /// Enrol N hosts, one file each in --out-dir.
        #[arg(long, requires = "out_dir", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
        count: Option<u32>,
        /// Where --count writes its files (created 0700 if missing).
        #[arg(long)]
        out_dir: Option<PathBuf>,
        /// A label for the operator's records (a host name, an asset tag), 1 to 64 printable
        /// characters; the issuer shows it on revoke. It never reaches the agent or a token.
        #[arg(long)]
        label: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a credential: from its next request on the issuer answers it UnknownCredential.
    ///
    /// Tokens already issued stay valid for their day (the issuer cannot tell them apart:
    /// that is the point). Give the id `enrol` printed (16 or more hex digits) or the host's
    /// credential file. Exit code 3 when no credential, or more than one, matches. Example:
    ///   penrose-issuer revoke --state /var/lib/penrose-issuer 3f9a0c1d5e7b2468
    #[command(group(ArgGroup::new("which").required(true).args(["id", "credential"])))]
    Revoke {
        /// The state directory.
        #[command(flatten)]
        state: StateArg,
        /// The credential's id or a prefix of it (at least 16 hex digits).
        id: Option<String>,
        /// The host's credential file instead of its id.
        #[arg(long)]
        credential: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the issuer: a QUIC endpoint (ALPN penrose-issuer/1) answering key set and token
    /// requests, and the control socket.
    ///
    /// Each enrolled credential gets at most --tokens-per-epoch tokens (24, the most allowed)
    /// per day and counter, for today and tomorrow only, in batches; a batch beyond it is
    /// answered with what remains and nothing is issued. Each credential may ask
    /// --requests-per-hour times an hour (a bucket that holds that many). Counts are written,
    /// synced, before tokens leave. The key set published holds the keys of the days from
    /// today-2 to today+2 for every counter, the same for every client.
    ///
    /// On first start it makes a self-signed TLS certificate (STATE/tls/cert.pem, key 0600)
    /// for agents to pin, unless --cert and --key name others. It prints one JSON line
    /// (listening, certificate, control, key_set_digest), then logs to stderr; SIGINT/SIGTERM
    /// stop it. Example:
    ///   penrose-issuer serve --state /var/lib/penrose-issuer --listen 0.0.0.0:4434
    Serve {
        /// The state directory.
        #[command(flatten)]
        state: StateArg,
        /// QUIC listen address (UDP).
        #[arg(long, default_value = crate::service::DEFAULT_LISTEN)]
        listen: SocketAddr,
        /// Also accept QUIC carried on TCP streams here: the port agents that fetch tokens
        /// over Tor name as `transport.issuer_stream` [default: off].
        #[arg(long)]
        stream_listen: Option<SocketAddr>,
        /// TLS certificate (PEM or DER) [default: STATE/tls/cert.pem, self-signed on first
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
        /// Tokens per credential, day and counter: 1 to 24 (the contributor threshold counts
        /// with 24; it can only be lowered).
        #[arg(long, default_value_t = 24)]
        tokens_per_epoch: u32,
        /// Requests per credential per hour (also the burst), at least 1.
        #[arg(long, default_value_t = DEFAULT_REQUESTS_PER_HOUR)]
        requests_per_hour: u32,
        /// Connections one source (IPv4 address, IPv6 /64) may have open at once
        /// [default: 512].
        #[arg(long)]
        connections_per_source: Option<usize>,
        /// New connections one source may open per second; 0 for no limit [default: 500].
        #[arg(long)]
        new_connections_per_source: Option<u32>,
    },
    /// Write the public key set published on a day (what `serve` answers key set requests
    /// with): the keys of DAY-2 to DAY+2 for every counter.
    ///
    /// Public. Publish it beside the issuer (or ship it with the agent) so that agents can
    /// check that the issuer gives everybody the same set: it prints the set's SHA-256.
    /// Example:
    ///   penrose-issuer key-set --state /var/lib/penrose-issuer --out keyset.bin
    KeySet {
        /// The state directory.
        #[command(flatten)]
        state: StateArg,
        /// Where to write the set.
        #[arg(long)]
        out: PathBuf,
        /// The day: today, today+N, today-N, YYYY-MM-DD or a day number.
        #[arg(long, default_value = "today")]
        day: DaySpec,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the key ring the aggregation server verifies tokens with: the secret keys of
    /// every day from --from to --to and every counter (mode 0600).
    ///
    /// Secret: whoever holds it can mint tokens for those days. Give it to the aggregation
    /// server (`penrose-aggregator serve --token-keys RING`) and export the next range before
    /// this one runs out (the default covers two days back and a week ahead). An existing
    /// file is replaced atomically. Example:
    ///   penrose-issuer export-keys --state /var/lib/penrose-issuer --out tokens.ring --to today+30
    ExportKeys {
        /// The state directory.
        #[command(flatten)]
        state: StateArg,
        /// Where to write the ring.
        #[arg(long)]
        out: PathBuf,
        /// The first day: today, today+N, today-N, YYYY-MM-DD or a day number.
        #[arg(long, default_value = "today-2")]
        from: DaySpec,
        /// The last day.
        #[arg(long, default_value = "today+7")]
        to: DaySpec,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Enrolled and revoked credentials, and tokens issued per day still kept (and, while
    /// serving, the counters since start).
    Status {
        /// The state directory.
        #[command(flatten)]
        state: StateArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_definition_is_consistent() {
        command().debug_assert();
    }
}
