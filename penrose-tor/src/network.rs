//! Which Tor network the agent uses. The public Tor network is chosen only by the word
//! `public` in the agent's production configuration; anything else is an arti configuration
//! file that must replace arti's built-in directory authorities and fallback relays (a private
//! network, such as the one the tests and the demo run on loopback). A file that replaces only
//! one of them is refused, since arti would fill in the other from its public defaults.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use arti_client::config::{CfgPath, TorClientConfig, TorClientConfigBuilder};

use crate::error::TorError;

/// The Tor network reports go through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TorNetwork {
    /// The public Tor network, with arti's built-in authorities and fallback relays.
    Public,
    /// A network described by an arti configuration file (`tor_network.authorities` and
    /// `tor_network.fallback_caches` both replaced, plus whatever else that network needs,
    /// such as `address_filter.allow_local_addrs` on loopback).
    Private(PathBuf),
}

impl FromStr for TorNetwork {
    type Err = TorError;

    fn from_str(s: &str) -> Result<TorNetwork, TorError> {
        match s.trim() {
            "" => Err(TorError::NoNetwork),
            "public" => Ok(TorNetwork::Public),
            path => Ok(TorNetwork::Private(PathBuf::from(path))),
        }
    }
}

impl fmt::Display for TorNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TorNetwork::Public => f.write_str("public"),
            TorNetwork::Private(path) => write!(f, "{}", path.display()),
        }
    }
}

impl TorNetwork {
    /// arti's configuration for this network, with its state and cache under `state_dir`
    /// (so that a restarted agent bootstraps from its cached directory).
    pub fn arti_config(&self, state_dir: &Path) -> Result<TorClientConfig, TorError> {
        let mut builder = match self {
            TorNetwork::Public => TorClientConfigBuilder::default(),
            TorNetwork::Private(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| TorError::Read {
                    path: path.clone(),
                    source,
                })?;
                private_builder(path, &text)?
            }
        };
        builder
            .storage()
            .state_dir(CfgPath::new_literal(state_dir.join("state")))
            .cache_dir(CfgPath::new_literal(state_dir.join("cache")));
        builder.build().map_err(|e| TorError::Config(e.to_string()))
    }
}

/// Parses a private network file, refusing one that leaves any public default in place.
fn private_builder(path: &Path, text: &str) -> Result<TorClientConfigBuilder, TorError> {
    let parse_error = |reason: String| TorError::Parse {
        path: path.to_owned(),
        reason,
    };
    let value: toml::Table = toml::from_str(text).map_err(|e| parse_error(e.to_string()))?;
    if value.contains_key("storage") {
        return Err(TorError::StorageInNetworkFile {
            path: path.to_owned(),
        });
    }
    let network = value.get("tor_network").and_then(toml::Value::as_table);
    for key in ["fallback_caches", "authorities"] {
        let replaced = network.and_then(|n| n.get(key)).is_some_and(|v| match v {
            toml::Value::Array(items) => !items.is_empty(),
            toml::Value::Table(table) => !table.is_empty(),
            _ => false,
        });
        if !replaced {
            return Err(TorError::NotReplaced {
                path: path.to_owned(),
                missing: key,
            });
        }
    }
    toml::from_str(text).map_err(|e| parse_error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_network_must_be_named() {
        assert!(matches!("".parse::<TorNetwork>(), Err(TorError::NoNetwork)));
        assert!(matches!(
            " ".parse::<TorNetwork>(),
            Err(TorError::NoNetwork)
        ));
        assert_eq!("public".parse::<TorNetwork>().unwrap(), TorNetwork::Public);
        assert_eq!(
            "/etc/penrose/tor.toml".parse::<TorNetwork>().unwrap(),
            TorNetwork::Private(PathBuf::from("/etc/penrose/tor.toml"))
        );
    }

    #[test]
    fn a_private_network_that_keeps_any_public_default_is_refused() {
        let path = Path::new("net.toml");
        let only_fallbacks = r#"
            [tor_network]
            fallback_caches = [{ rsa_identity = "0000000000000000000000000000000000000000", ed_identity = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", orports = ["127.0.0.1:5000"] }]
        "#;
        assert!(matches!(
            private_builder(path, only_fallbacks),
            Err(TorError::NotReplaced {
                missing: "authorities",
                ..
            })
        ));
        let empty_fallbacks = "[tor_network]\nfallback_caches = []\n";
        assert!(matches!(
            private_builder(path, empty_fallbacks),
            Err(TorError::NotReplaced {
                missing: "fallback_caches",
                ..
            })
        ));
        assert!(matches!(
            private_builder(path, "[address_filter]\nallow_local_addrs = true\n"),
            Err(TorError::NotReplaced {
                missing: "fallback_caches",
                ..
            })
        ));
        assert!(matches!(
            private_builder(path, "[storage]\nstate_dir = \"/tmp/x\"\n"),
            Err(TorError::StorageInNetworkFile { .. })
        ));
        assert!(matches!(
            private_builder(path, "not toml ["),
            Err(TorError::Parse { .. })
        ));
    }
}
