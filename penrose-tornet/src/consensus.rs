//! Is the network usable yet? What a client would see, asked the way a client asks: the
//! authorities' directory ports on 127.0.0.1 serve the microdescriptor consensus and the
//! microdescriptors it names, over plain HTTP/1.0.

use std::fmt;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::TorNetError;

/// How long one directory request may take (loopback: anything slower is a hung tor).
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// One relay's entry in a consensus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsensusEntry {
    /// The relay's nickname (unique in this network).
    pub nickname: String,
    /// Its ORPort as listed.
    pub or_port: u16,
    /// Its flags (`Running`, `Valid`, `Guard`, `Exit`, ...).
    pub flags: Vec<String>,
    /// The digest of its microdescriptor (base64, as listed on the `m` line).
    pub microdesc: Option<String>,
}

impl ConsensusEntry {
    /// Whether the entry carries a flag.
    #[must_use]
    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// Parses the router entries of a microdescriptor consensus (`r`, `m` and `s` lines).
///
/// # Errors
/// [`TorNetError::Parse`] when an `r` line is short or its port is not a number.
pub fn parse_microdesc_consensus(text: &str) -> Result<Vec<ConsensusEntry>, TorNetError> {
    let mut entries: Vec<ConsensusEntry> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_ascii_whitespace();
        match words.next() {
            // r nickname identity published-date published-time address orport dirport
            Some("r") => {
                let fields: Vec<&str> = words.collect();
                let bad = || TorNetError::Parse {
                    what: "consensus r line".into(),
                    detail: line.to_owned(),
                };
                let nickname = fields.first().ok_or_else(bad)?;
                let or_port = fields.get(5).and_then(|p| p.parse().ok()).ok_or_else(bad)?;
                entries.push(ConsensusEntry {
                    nickname: (*nickname).to_owned(),
                    or_port,
                    flags: Vec::new(),
                    microdesc: None,
                });
            }
            Some("m") => {
                if let Some(entry) = entries.last_mut() {
                    entry.microdesc = words.next().map(str::to_owned);
                }
            }
            Some("s") => {
                if let Some(entry) = entries.last_mut() {
                    entry.flags = words.map(str::to_owned).collect();
                }
            }
            _ => {}
        }
    }
    Ok(entries)
}

/// Counts the microdescriptors in a directory answer: each one holds exactly one
/// `ntor-onion-key` line (tor 0.4.9 no longer writes the TAP `onion-key`).
#[must_use]
pub fn count_microdescs(text: &str) -> usize {
    text.lines()
        .filter(|line| line.starts_with("ntor-onion-key "))
        .count()
}

/// What is expected of the consensus: each relay's nickname and the flags it must carry.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    /// (nickname, ORPort, flags beyond Running and Valid).
    pub relays: Vec<(String, u16, Vec<&'static str>)>,
}

/// What one readiness check saw, the weakest authority's view (a client may ask any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Authorities that served a consensus.
    pub authorities_with_consensus: usize,
    /// Authorities asked.
    pub authorities: usize,
    /// Relays (authorities included) that serve a consensus listing every relay with its
    /// flags: an exit without one answers every BEGIN with END (reason MISC).
    pub relays_with_consensus: usize,
    /// Relays expected.
    pub relays: usize,
    /// Expected relays listed Running and Valid with their expected flags, fewest over the
    /// authorities.
    pub relays_flagged: usize,
    /// Entries with the Guard flag, fewest over the authorities.
    pub guards: usize,
    /// Entries with the Exit flag, fewest over the authorities.
    pub exits: usize,
    /// Microdescriptors served for the consensus's entries, fewest over the authorities.
    pub microdescs: usize,
    /// The last thing that went wrong asking, if anything (tor not listening yet, a 404).
    pub last_problem: Option<String>,
}

impl Readiness {
    /// Whether a client can bootstrap and build circuits: every authority serves a consensus
    /// listing every relay Running and Valid with its flags, and every microdescriptor.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.authorities > 0
            && self.authorities_with_consensus == self.authorities
            && self.relays_flagged == self.relays
            && self.exits > 0
            && self.guards > 0
            && self.microdescs == self.relays
            && self.relays_with_consensus == self.relays
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} authorities serve a consensus; {}/{} relays Running+Valid with their flags \
             ({} Guard, {} Exit); {}/{} microdescriptors; {}/{} relays have the consensus",
            self.authorities_with_consensus,
            self.authorities,
            self.relays_flagged,
            self.relays,
            self.guards,
            self.exits,
            self.microdescs,
            self.relays,
            self.relays_with_consensus,
            self.relays,
        )?;
        if let Some(problem) = &self.last_problem {
            write!(f, "; last problem: {problem}")?;
        }
        Ok(())
    }
}

/// Asks every authority's directory port and sums up what a client would get; then, once
/// that is complete, asks every relay's directory port whether it has the consensus too.
pub(crate) fn check(
    authorities: &[SocketAddr],
    relays: &[SocketAddr],
    expected: &Expected,
) -> Readiness {
    let mut state = Readiness {
        authorities: authorities.len(),
        relays: expected.relays.len(),
        relays_flagged: usize::MAX,
        guards: usize::MAX,
        exits: usize::MAX,
        microdescs: usize::MAX,
        ..Readiness::default()
    };
    for &authority in authorities {
        let view = match authority_view(authority, expected) {
            Ok(view) => view,
            Err(problem) => {
                state.last_problem = Some(format!("{authority}: {problem}"));
                AuthorityView::default()
            }
        };
        if view.has_consensus {
            state.authorities_with_consensus += 1;
        }
        state.relays_flagged = state.relays_flagged.min(view.relays_flagged);
        state.guards = state.guards.min(view.guards);
        state.exits = state.exits.min(view.exits);
        state.microdescs = state.microdescs.min(view.microdescs);
    }
    if authorities.is_empty() {
        state.relays_flagged = 0;
        state.guards = 0;
        state.exits = 0;
        state.microdescs = 0;
    }
    if state.relays_flagged == state.relays && state.microdescs == state.relays {
        state.relays_with_consensus = relays
            .iter()
            .filter(|&&relay| {
                match http_get(relay, "/tor/status-vote/current/consensus-microdesc") {
                    Ok(text) => parse_microdesc_consensus(&text)
                        .is_ok_and(|entries| flagged(&entries, expected) == expected.relays.len()),
                    Err(problem) => {
                        state.last_problem = Some(format!("{relay}: {problem}"));
                        false
                    }
                }
            })
            .count();
    }
    state
}

/// How many expected relays the entries list Running and Valid with their expected flags.
fn flagged(entries: &[ConsensusEntry], expected: &Expected) -> usize {
    expected
        .relays
        .iter()
        .filter(|(nickname, or_port, flags)| {
            entries.iter().any(|e| {
                &e.nickname == nickname
                    && e.or_port == *or_port
                    && e.has("Running")
                    && e.has("Valid")
                    && flags.iter().all(|flag| e.has(flag))
            })
        })
        .count()
}

/// One authority's answers.
#[derive(Debug, Default)]
struct AuthorityView {
    has_consensus: bool,
    relays_flagged: usize,
    guards: usize,
    exits: usize,
    microdescs: usize,
}

/// Fetches one authority's consensus and, once it lists everyone, their microdescriptors.
fn authority_view(authority: SocketAddr, expected: &Expected) -> Result<AuthorityView, String> {
    let text = http_get(authority, "/tor/status-vote/current/consensus-microdesc")?;
    let entries = parse_microdesc_consensus(&text).map_err(|e| e.to_string())?;
    let mut view = AuthorityView {
        has_consensus: true,
        guards: entries.iter().filter(|e| e.has("Guard")).count(),
        exits: entries.iter().filter(|e| e.has("Exit")).count(),
        ..AuthorityView::default()
    };
    view.relays_flagged = flagged(&entries, expected);
    if view.relays_flagged < expected.relays.len() {
        return Ok(view);
    }
    let digests: Vec<&str> = entries
        .iter()
        .filter_map(|e| e.microdesc.as_deref())
        .collect();
    if digests.is_empty() {
        return Ok(view);
    }
    let answer = http_get(authority, &format!("/tor/micro/d/{}", digests.join("-")))?;
    view.microdescs = count_microdescs(&answer);
    Ok(view)
}

/// A plain HTTP/1.0 GET of an uncompressed directory document; the body when the answer is
/// 200, else the status line.
fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HTTP_TIMEOUT)))
        .map_err(|e| format!("socket: {e}"))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "an answer without a header".to_owned())?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_ascii_whitespace().nth(1) != Some("200") {
        return Err(format!("GET {path}: {status}"));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSENSUS: &str = "network-status-version 3 microdesc\n\
        r auth0 AAAA 2026-12-01 20:00:00 127.0.0.1 5000 5001\n\
        m abcDEF\n\
        s Authority Fast Guard HSDir Running Stable V2Dir Valid\n\
        r exit0 BBBB 2026-12-01 20:00:00 127.0.0.1 5010 5011\n\
        m ghiJKL\n\
        s Exit Fast Running V2Dir Valid\n\
        directory-footer\n";

    #[test]
    fn consensus_entries_carry_port_flags_and_digest() {
        let entries = parse_microdesc_consensus(CONSENSUS).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].nickname, "auth0");
        assert_eq!(entries[0].or_port, 5000);
        assert!(entries[0].has("Guard") && !entries[0].has("Exit"));
        assert_eq!(entries[1].microdesc.as_deref(), Some("ghiJKL"));
        assert!(entries[1].has("Exit"));
    }

    #[test]
    fn a_short_r_line_is_an_error() {
        assert!(parse_microdesc_consensus("r auth0 AAAA\n").is_err());
    }

    #[test]
    fn readiness_needs_everything() {
        let mut state = Readiness {
            authorities_with_consensus: 3,
            authorities: 3,
            relays_with_consensus: 7,
            relays: 7,
            relays_flagged: 7,
            guards: 5,
            exits: 2,
            microdescs: 7,
            last_problem: None,
        };
        assert!(state.is_ready());
        state.microdescs = 6;
        assert!(!state.is_ready());
        state.microdescs = 7;
        state.authorities_with_consensus = 2;
        assert!(!state.is_ready());
        state.authorities_with_consensus = 3;
        state.relays_with_consensus = 6;
        assert!(!state.is_ready());
    }
}
