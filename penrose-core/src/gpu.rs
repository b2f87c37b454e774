//! The GPU architecture a report's counters were read on.
//!
//! Counters of different GPU generations do not add up (an SM-active share on one generation
//! is not the same quantity on another), so a report names the architecture and the servers
//! keep sums per (class, architecture, counter).
//!
//! **Coarse on purpose.** A report names only the GPU *generation*: the major version of the
//! compute capability, with the minor version zeroed (`sm_80` stands for every 8.x: A100,
//! the RTX 30 series and Ada alike), and only a generation in [`GENERATIONS`], the shipping
//! ones. The agent coarsens before sealing ([`GpuArch::generation`]) and the aggregation
//! server refuses any other value, so a report can never name a rare model (a minor version
//! sold in small numbers, an engineering sample of a generation not yet shipped) that would
//! narrow its owner's anonymity set to a few hosts (docs/threat-model.md, "The GPU
//! architecture a report names").

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// A compute capability (major.minor), or [`GpuArch::UNKNOWN`] where none could be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuArch {
    /// Major version (8 = Ampere, 9 = Hopper, 10 and 12 = Blackwell).
    pub major: u8,
    /// Minor version.
    pub minor: u8,
}

/// Why a text is not an architecture.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("not a GPU architecture: {0:?} (expected `unknown` or `sm_MAJORMINOR`, e.g. `sm_90`)")]
pub struct ParseGpuArchError(String);

impl GpuArch {
    /// No architecture known.
    pub const UNKNOWN: GpuArch = GpuArch { major: 0, minor: 0 };

    /// An architecture from its compute capability.
    pub const fn new(major: u8, minor: u8) -> Self {
        Self { major, minor }
    }

    /// The generation a report names for this compute capability: the major version with the
    /// minor zeroed, when that is one of the shipping [`GENERATIONS`]; `None` otherwise (no
    /// report may name it).
    pub fn generation(self) -> Option<GpuArch> {
        let coarse = Self::new(self.major, 0);
        GENERATIONS.contains(&coarse).then_some(coarse)
    }

    /// Whether a report may name this value as it is: one of the [`GENERATIONS`].
    pub fn is_reportable(self) -> bool {
        GENERATIONS.contains(&self)
    }

    /// Whether this is [`GpuArch::UNKNOWN`].
    pub fn is_unknown(self) -> bool {
        self == Self::UNKNOWN
    }

    /// The wire form: major, minor.
    pub fn to_bytes(self) -> [u8; 2] {
        [self.major, self.minor]
    }

    /// Reads the wire form.
    pub fn from_bytes(bytes: [u8; 2]) -> Self {
        Self::new(bytes[0], bytes[1])
    }
}

/// The generations a report may name (compute capability major versions of shipping GPUs,
/// minor zeroed): Volta and Turing (7), Ampere and Ada (8), Hopper (9), Blackwell data centre
/// (10), Thor (11) and Blackwell workstation and desktop (12). Each stands for a large share of
/// a fleet; adding one is a privacy decision (module docs) and needs agents and servers that
/// know it.
pub const GENERATIONS: [GpuArch; 6] = [
    GpuArch::new(7, 0),
    GpuArch::new(8, 0),
    GpuArch::new(9, 0),
    GpuArch::new(10, 0),
    GpuArch::new(11, 0),
    GpuArch::new(12, 0),
];

impl fmt::Display for GpuArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unknown() {
            f.write_str("unknown")
        } else {
            write!(f, "sm_{}{}", self.major, self.minor)
        }
    }
}

impl FromStr for GpuArch {
    type Err = ParseGpuArchError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "unknown" {
            return Ok(Self::UNKNOWN);
        }
        let err = || ParseGpuArchError(s.to_owned());
        let digits = s.strip_prefix("sm_").ok_or_else(err)?;
        // The last digit is the minor version, the rest the major: sm_90, sm_100, sm_120.
        if !(2..=4).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let (major, minor) = digits.split_at(digits.len() - 1);
        let arch = Self::new(
            major.parse().map_err(|_| err())?,
            minor.parse().map_err(|_| err())?,
        );
        if arch.is_unknown() {
            return Err(err());
        }
        Ok(arch)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips_and_bad_text_is_refused() {
        for arch in [GpuArch::UNKNOWN, GpuArch::new(9, 0), GpuArch::new(12, 0)] {
            assert_eq!(arch.to_string().parse::<GpuArch>().unwrap(), arch);
        }
        assert_eq!(GpuArch::new(8, 6).to_string(), "sm_86");
        assert_eq!(GpuArch::new(10, 0).to_string(), "sm_100");
        for bad in [
            "", "sm_", "sm_9", "sm_00", "90", "sm_9a", "sm_99999", "sm_2560",
        ] {
            assert!(bad.parse::<GpuArch>().is_err(), "{bad}");
        }
    }

    #[test]
    fn reports_name_only_shipping_generations_with_the_minor_version_zeroed() {
        assert_eq!(GpuArch::new(8, 6).generation(), Some(GpuArch::new(8, 0)));
        assert_eq!(GpuArch::new(8, 9).generation(), Some(GpuArch::new(8, 0)));
        assert_eq!(GpuArch::new(9, 0).generation(), Some(GpuArch::new(9, 0)));
        assert_eq!(GpuArch::new(12, 1).generation(), Some(GpuArch::new(12, 0)));
        for rare in [GpuArch::UNKNOWN, GpuArch::new(6, 1), GpuArch::new(13, 0)] {
            assert_eq!(rare.generation(), None, "{rare}");
        }
        for g in GENERATIONS {
            assert!(g.is_reportable());
            assert_eq!(g.generation(), Some(g));
        }
        for not in [GpuArch::UNKNOWN, GpuArch::new(8, 6), GpuArch::new(13, 0)] {
            assert!(!not.is_reportable(), "{not}");
        }
    }

    #[test]
    fn bytes_round_trip() {
        let arch = GpuArch::new(9, 0);
        assert_eq!(GpuArch::from_bytes(arch.to_bytes()), arch);
    }
}
