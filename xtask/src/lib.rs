//! What more than one `cargo xtask` task needs, so that no task reaches into another: each
//! task (the binary's modules) imports from here and nowhere else in xtask.

/// Where the workspace, its build outputs and its test equipment are.
pub mod workspace;

/// The machine and the date a benchmark report was measured on.
pub mod machine;

/// Sizes the benchmarks read off the system: a process's memory, a directory's bytes.
pub mod measure;

/// Starting the product's servers as the separate processes they are.
pub mod servers;
