//! Snippet fingerprints (placeholder until the fingerprint work lands).

/// The 256-bit snippet hash a report carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnippetHash(pub [u8; 32]);
