//! The torrc of each node. Every line that is not tor's default says why it is there: most
//! exist because all relays share 127.0.0.1 and the network has no DNS and no other machine.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// A node's part in the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A directory authority; also a guard and a middle relay.
    Authority,
    /// A middle relay; also a guard.
    Middle,
    /// An exit relay; never a guard.
    Exit,
}

/// What every torrc needs to know about the others.
pub(crate) struct Shared<'a> {
    /// `DirAuthority` lines, one per authority.
    pub dir_authorities: &'a [String],
    /// Fingerprints (`$HEX`) of the relays that get the Guard flag.
    pub guards: &'a [String],
    /// Fingerprints (`$HEX`) of the relays that get the Exit flag.
    pub exits: &'a [String],
    /// The voting interval.
    pub voting_interval: Duration,
    /// The process that owns the network: tor exits when it is gone.
    pub owner_pid: u32,
}

/// One node's own settings.
pub(crate) struct Own<'a> {
    pub nickname: &'a str,
    pub role: Role,
    pub data_dir: &'a Path,
    pub or_port: u16,
    pub dir_port: u16,
}

/// The minimal torrc `tor --list-fingerprint` needs to create a relay's keys.
pub(crate) fn keygen(own: &Own<'_>) -> String {
    format!(
        "DataDirectory {}\nNickname {}\nContactInfo penrose-tornet test network\n\
         Address 127.0.0.1\nORPort 127.0.0.1:{}\nSocksPort 0\nLog notice file {}\n",
        own.data_dir.display(),
        own.nickname,
        own.or_port,
        own.data_dir.join("keygen.log").display(),
    )
}

/// The full torrc of a node.
pub(crate) fn render(own: &Own<'_>, shared: &Shared<'_>) -> String {
    let dir = own.data_dir.display();
    let mut rc = format!(
        "# penrose-tornet: test equipment, a private Tor network on loopback.\n\
         # Testing defaults: no minimum uptime or bandwidth for flags, private addresses allowed,\n\
         # relays on one address allowed, fast directory downloads.\n\
         TestingTorNetwork 1\n\
         DataDirectory {dir}\n\
         Nickname {nickname}\n\
         ContactInfo penrose-tornet test network\n\
         Log notice file {dir}/notice.log\n\
         SafeLogging 0\n\
         RunAsDaemon 0\n\
         # Exit when the process that started the network is gone, even if it was killed.\n\
         __OwningControllerProcess {owner}\n\
         # SIGTERM is the way we stop it; SIGINT would wait 30 s before a relay exits.\n\
         ShutdownWaitLength 0\n\
         # One worker thread: seven tors share a CI machine of two cores.\n\
         NumCPUs 1\n\
         Address 127.0.0.1\n\
         ORPort 127.0.0.1:{or_port}\n\
         DirPort 127.0.0.1:{dir_port}\n\
         SocksPort 0\n\
         # Nobody can reach 127.0.0.1 from outside to test it, and nobody needs to.\n\
         AssumeReachable 1\n\
         DirAllowPrivateAddresses 1\n\
         EnforceDistinctSubnets 0\n",
        nickname = own.nickname,
        owner = shared.owner_pid,
        or_port = own.or_port,
        dir_port = own.dir_port,
    );
    for line in shared.dir_authorities {
        let _ = writeln!(rc, "{line}");
    }
    match own.role {
        Role::Authority => authority(&mut rc, shared),
        Role::Middle => {
            rc.push_str("ExitRelay 0\nExitPolicy reject *:*\n");
        }
        Role::Exit => exit(&mut rc, own),
    }
    rc
}

/// An authority's voting settings.
fn authority(rc: &mut String, shared: &Shared<'_>) {
    let interval = shared.voting_interval.as_secs().max(2);
    // Votes and signatures each get a fifth of the interval, at least 2 s (tor's floor).
    let delay = (interval / 5).max(2);
    let _ = write!(
        rc,
        "AuthoritativeDirectory 1\n\
         V3AuthoritativeDirectory 1\n\
         ExitRelay 0\n\
         ExitPolicy reject *:*\n\
         # A consensus every {interval} s, from the first vote on (TestingTorNetwork alone waits\n\
         # 150 s for the first).\n\
         V3AuthVotingInterval {interval}\n\
         V3AuthVoteDelay {delay}\n\
         V3AuthDistDelay {delay}\n\
         TestingV3AuthInitialVotingInterval {interval}\n\
         TestingV3AuthInitialVoteDelay {delay}\n\
         TestingV3AuthInitialDistDelay {delay}\n\
         TestingV3AuthVotingStartOffset 0\n\
         # All relays share 127.0.0.1.\n\
         AuthDirMaxServersPerAddr 0\n\
         # Guards only among authorities and middles, exits only the exits, strictly: a client\n\
         # must never pick an exit as its guard, or a 3-hop path through 7 relays could not be\n\
         # built reliably.\n\
         TestingDirAuthVoteGuard {guards}\n\
         TestingDirAuthVoteGuardIsStrict 1\n\
         TestingDirAuthVoteExit {exits}\n\
         TestingDirAuthVoteExitIsStrict 1\n",
        guards = shared.guards.join(","),
        exits = shared.exits.join(","),
    );
}

/// An exit's policy, outbound address and DNS settings.
fn exit(rc: &mut String, own: &Own<'_>) {
    let dir = own.data_dir.display();
    rc.push_str(
        "ExitRelay 1\n\
         IPv6Exit 0\n\
         # Loopback is where the test servers are. Clients read the policy summary of the\n\
         # microdescriptor, which leaves private ranges out, hence the accept *:* after it\n\
         # (harmless: the namespace has nothing but loopback).\n\
         ExitPolicyRejectPrivate 0\n\
         ExitPolicyRejectLocalInterfaces 0\n\
         ExitPolicy accept 127.0.0.0/8:*\n\
         ExitPolicy accept *:*\n",
    );
    let _ = write!(
        rc,
        "# No DNS here: no hijack tests against public names, a resolver on 127.0.0.1.\n\
         ServerDNSDetectHijacking 0\n\
         ServerDNSTestAddresses\n\
         ServerDNSAllowBrokenConfig 1\n\
         ServerDNSResolvConfFile {dir}/resolv.conf\n"
    );
}
