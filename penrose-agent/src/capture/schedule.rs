//! When capture windows open: a fixed schedule, or one spaced by an overhead budget.
//!
//! The scheduler is pure logic and lives in [`penrose_core::schedule`], where the design
//! server's fleet simulator runs it too; it is re-exported here so that the capture keeps
//! naming it `capture::schedule`. The agent supplies what only it can measure: the probe cost
//! ([`super::calibrate`]) and the probed processes' CPU time ([`super::cpu`]).

pub use penrose_core::schedule::{
    BudgetConfig, DEFAULT_BUDGET, OverheadBudget, ProbeCost, Schedule, WindowCost,
    achieved_overhead, probe_time,
};
