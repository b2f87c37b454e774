//! The auditor's own release rule: its contributor threshold k and the cap T it counts
//! contributors with (`penrose_core::release`). It applies them itself to every sum it is
//! asked to decrypt, whatever the bundle says the aggregation server applied: otherwise its
//! consent would be a rubber stamp. Both have floors (`Threshold`, `ReportsPerContributor`), so
//! the auditor can only be stricter than every other tier.

use std::path::Path;

use penrose_core::release::{ReleaseRule, ReportsPerContributor, Threshold};
use serde::{Deserialize, Serialize};

use crate::error::AuditorError;
use penrose_host::durable::{self, Access};

/// k and T, validated against their floors: the shared [`ReleaseRule`], kept in the auditor's
/// own file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy(ReleaseRule);

/// The file form: two numbers, checked against the floors again when read.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    threshold: u64,
    cap: u32,
}

impl Policy {
    /// A threshold of `k` contributors counted with a cap of `t` reports per contributor,
    /// counter and day; refused under the floors.
    pub fn new(k: u64, t: u32) -> Result<Self, AuditorError> {
        Ok(Policy(ReleaseRule::new(k, t)?))
    }

    /// The rule.
    pub fn rule(&self) -> ReleaseRule {
        self.0
    }

    /// k.
    pub fn threshold(&self) -> Threshold {
        self.0.threshold
    }

    /// T.
    pub fn cap(&self) -> ReportsPerContributor {
        self.0.cap
    }

    /// Whether a sum of `reports` reports over `days` days may be decrypted.
    pub fn releases(&self, reports: u64, days: u32) -> bool {
        self.0.releases(reports, days)
    }

    /// Reads the policy file, refusing values under the floors (a hand-edited file cannot
    /// make the auditor laxer than `init` could).
    pub fn load(path: &Path) -> Result<Self, AuditorError> {
        let text = std::fs::read(path).map_err(AuditorError::io(path))?;
        let file: PolicyFile =
            serde_json::from_slice(&text).map_err(|e| AuditorError::corrupt(path, e))?;
        Policy::new(file.threshold, file.cap).map_err(|e| AuditorError::corrupt(path, e))
    }

    /// Writes the policy file durably.
    pub fn save(&self, path: &Path) -> Result<(), AuditorError> {
        let file = PolicyFile {
            threshold: self.threshold().get(),
            cap: self.cap().get(),
        };
        let mut text =
            serde_json::to_vec_pretty(&file).map_err(|e| AuditorError::corrupt(path, e))?;
        text.push(b'\n');
        Ok(durable::replace(path, &text, Access::Public)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn floors_hold_when_made_and_when_read() {
        assert!(Policy::new(9, 24).is_err());
        assert!(Policy::new(10, 23).is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policy.json");
        Policy::new(12, 48).unwrap().save(&path).unwrap();
        assert_eq!(Policy::load(&path).unwrap(), Policy::new(12, 48).unwrap());
        std::fs::write(&path, r#"{"threshold": 2, "cap": 24}"#).unwrap();
        assert!(matches!(
            Policy::load(&path),
            Err(AuditorError::Corrupt { .. })
        ));
    }

    #[test]
    fn the_rule_counts_contributors_over_days() {
        let policy = Policy::default();
        assert!(policy.releases(217, 1));
        assert!(!policy.releases(216, 1));
        assert!(!policy.releases(217, 2));
    }
}
