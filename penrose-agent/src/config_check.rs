//! What `penrose-agent config --check FILE` says about a configuration file that loaded: the
//! settings an operator most often gets wrong (where state goes, where reports go, whether
//! the agent runs at all), and a warning when the file names test equipment or the direct
//! route.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::AgentConfig;

/// A valid configuration file, summarised.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigCheck {
    /// The file checked.
    pub path: PathBuf,
    /// `state_dir`.
    pub state_dir: PathBuf,
    /// `aggregator.address`.
    pub aggregator: String,
    /// `enabled`.
    pub enabled: bool,
    /// When `capture.source` or `capture.counters` names test equipment: the two settings'
    /// names (source, counters).
    pub test_equipment: Option<(String, String)>,
    /// `transport.route`.
    pub route: crate::config::RouteChoice,
    /// What the route gives away, when it gives something away (the direct route).
    pub route_warning: Option<String>,
}

impl ConfigCheck {
    /// The summary of `config`, loaded from `path`.
    pub fn new(path: &Path, config: &AgentConfig) -> Self {
        let c = &config.capture;
        Self {
            path: path.to_owned(),
            state_dir: config.state_dir.clone(),
            aggregator: config.aggregator.address.clone(),
            enabled: config.enabled,
            test_equipment: (c.source.is_test_equipment() || c.counters.is_test_equipment())
                .then(|| (c.source.name().to_string(), c.counters.name().to_string())),
            route: config.transport.route,
            route_warning: config.transport.route.warning().map(str::to_string),
        }
    }
}

/// The text form: one line, then one warning line per warning.
impl fmt::Display for ConfigCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: valid (state directory {}, aggregator {}, route {}, {})",
            self.path.display(),
            self.state_dir.display(),
            self.aggregator,
            route_name(self.route),
            if self.enabled { "enabled" } else { "disabled" }
        )?;
        if let Some(warning) = &self.route_warning {
            writeln!(f, "warning: {warning}")?;
        }
        if let Some((source, counters)) = &self.test_equipment {
            writeln!(
                f,
                "warning: test equipment configured (capture.source = {source:?}, capture.counters = {counters:?}): for tests and the demo, never a production host"
            )?;
        }
        Ok(())
    }
}

fn route_name(route: crate::config::RouteChoice) -> &'static str {
    match route {
        crate::config::RouteChoice::Direct => "direct",
        crate::config::RouteChoice::Tor => "tor",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_file_is_valid_and_names_no_test_equipment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, crate::config::DEFAULT_FILE).unwrap();
        let config = AgentConfig::load(&path).unwrap();
        let check = ConfigCheck::new(&path, &config);
        assert_eq!(check.test_equipment, None);
        assert_eq!(check.route_warning, None);
        assert_eq!(
            check.to_string(),
            format!(
                "{}: valid (state directory {}, aggregator {}, route tor, enabled)\n",
                path.display(),
                config.state_dir.display(),
                config.aggregator.address
            )
        );
    }

    #[test]
    fn test_equipment_is_warned_about_on_a_second_line() {
        let check = ConfigCheck {
            path: "a.toml".into(),
            state_dir: "/s".into(),
            aggregator: "127.0.0.1:1".into(),
            enabled: false,
            test_equipment: Some(("test-replay".into(), "none".into())),
            route: crate::config::RouteChoice::Tor,
            route_warning: None,
        };
        assert_eq!(
            check.to_string(),
            "a.toml: valid (state directory /s, aggregator 127.0.0.1:1, route tor, disabled)\n\
             warning: test equipment configured (capture.source = \"test-replay\", \
             capture.counters = \"none\"): for tests and the demo, never a production host\n"
        );
    }

    #[test]
    fn the_direct_route_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "[transport]\nroute = \"direct\"\n").unwrap();
        let config = AgentConfig::load(&path).unwrap();
        let text = ConfigCheck::new(&path, &config).to_string();
        assert!(text.contains("route direct"), "{text}");
        assert!(
            text.contains(&format!(
                "\nwarning: {}\n",
                crate::config::DIRECT_ROUTE_WARNING
            )),
            "{text}"
        );
    }
}
