//! Names of the maps in the compiled object, so the loader looks them up by the same spelling.

/// The ring buffer every event goes through.
pub const EVENTS: &str = "EVENTS";
/// Per-CPU `u64`, index 0: events the ring buffer had no room for.
pub const DROPS: &str = "DROPS";
/// Array of one [`crate::SampleConfig`], written by the agent.
pub const SAMPLE_CONFIG: &str = "SAMPLE_CONFIG";
/// Per-CPU `u64`, index 0: low half, launches left until the next sampled one on this CPU
/// plus one; high half, the launches of that sample's block (of S) that follow it. The agent
/// seeds it at every window (`penrose_core::sampling::Countdown::to_probe_word`); the programs
/// draw each next block's position with the period of [`crate::SampleConfig`].
pub const SAMPLE_COUNTDOWN: &str = "SAMPLE_COUNTDOWN";
/// LRU hash: a name call's out-pointer and argument, stashed by the entry probe for the return
/// probe of the same thread. Internal to the object; named here so the loader can size it.
pub const PENDING_CALLS: &str = "PENDING_CALLS";
/// Per-CPU scratch of one [`crate::NameEvent`], where a name is assembled before it is copied
/// into [`EVENTS`] with its actual length. Internal to the object.
pub const NAME_SCRATCH: &str = "NAME_SCRATCH";
/// Hash of [`crate::GraphKey`] to `u32`: how many kernels an executable graph runs, written by
/// the agent when it learns an instantiation or update, read by the graph launch programs so
/// the sampling countdown counts a graph's kernels. Holds [`crate::GRAPH_KERNELS_ENTRIES`].
pub const GRAPH_KERNELS: &str = "GRAPH_KERNELS";
