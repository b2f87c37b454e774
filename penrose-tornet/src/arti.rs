//! The arti-client configuration that points a client at this network and at nothing else.

use std::fmt::Write as _;

use crate::network::TorNetwork;
use crate::torrc::Role;

impl TorNetwork {
    /// An arti-client configuration fragment in arti's own TOML format (what
    /// `arti_client::config::TorClientConfigBuilder` deserializes), to be merged with the
    /// caller's storage directories.
    ///
    /// It *replaces* arti's built-in authorities and fallback caches with this network's, and
    /// the authorities' upload, download and vote addresses too, so that nothing of the public
    /// Tor network is left in the configuration (the safety rule; the loopback-only namespace
    /// is the other half). Because every relay shares 127.0.0.1, the subnet family prefixes
    /// are 33 and 129 (no two relays are ever "in the same subnet"), and local addresses are
    /// allowed.
    #[must_use]
    pub fn arti_toml(&self) -> String {
        let authorities: Vec<_> = self
            .relays()
            .iter()
            .filter(|r| r.role() == Role::Authority)
            .collect();
        let mut toml = String::from(
            "# penrose-tornet: a private Tor network on loopback (test equipment).\n\
             # Replaces arti's built-in authorities and fallbacks; nothing public is left.\n\
             [tor_network]\nfallback_caches = [\n",
        );
        for auth in &authorities {
            let _ = writeln!(
                toml,
                "    {{ rsa_identity = \"{}\", ed_identity = \"{}\", orports = [\"127.0.0.1:{}\"] }},",
                auth.fingerprint(),
                auth.ed25519_identity(),
                auth.or_port()
            );
        }
        toml.push_str("]\n\n[tor_network.authorities]\n");
        let list = |render: &dyn Fn(&crate::Relay) -> String| -> String {
            authorities
                .iter()
                .map(|a| render(a))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            toml,
            "v3idents = [{}]",
            list(&|a| format!("\"{}\"", a.v3ident().unwrap_or_default()))
        );
        let addrs = list(&|a| format!("[\"127.0.0.1:{}\"]", a.dir_port()));
        let _ = writeln!(toml, "uploads = [{addrs}]");
        let _ = writeln!(toml, "downloads = [{addrs}]");
        let _ = writeln!(toml, "votes = [{addrs}]");
        toml.push_str(
            "\n# All relays share 127.0.0.1: a prefix longer than the address puts each in a\n\
             # family of its own, so that paths can be built at all.\n\
             [path_rules]\nipv4_subnet_family_prefix = 33\nipv6_subnet_family_prefix = 129\n\n\
             [address_filter]\nallow_local_addrs = true\n",
        );
        toml
    }
}
