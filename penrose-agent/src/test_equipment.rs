//! What every part with test equipment behind it (the trace replay, the stand-in's counter
//! ring, the raw joint values in the record) says about it: whether this build has it, why a
//! setting naming it is refused, and the warning logged when one is in use. Its own module so
//! that the configuration and the parts it configures both use it without importing each
//! other.

/// Whether this build has the test equipment compiled in (the `test-util` feature: tests and
/// the demo). The binaries the packages ship do not, and refuse settings that name it.
pub const BUILT: bool = cfg!(feature = "test-util");

/// Why a setting that names test equipment is refused by a build without it.
pub fn not_built(setting: &str) -> String {
    format!(
        "{setting} is test equipment, which this build does not have: it is compiled in only \
         with the test-util feature, for tests and the demo, never in a packaged agent"
    )
}

/// Logs, at warning level, that a test-equipment setting is in use: `setting` (as written in
/// the configuration) and what it means.
pub fn warn(setting: &str, what: &str) {
    tracing::warn!(
        "TEST EQUIPMENT: {setting}: {what}. This setting exists for tests and the demo; a \
         production agent must not use it"
    );
}
