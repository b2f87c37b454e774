//! The fleet simulator (`penrose-design simulate`): how many hours until a fleet's
//! applications are covered (docs/design.md section 7; the numbers and how they compare with the
//! paper's are in docs/evaluation.md, "Fleet coverage (simulated)").
//!
//! # Coverage
//!
//! An application is **covered** at time t when, for every counter group of the catalogue
//! (`penrose_core::counters`: 3 groups in catalogue 2), the reports of that application and
//! group that reached the aggregation server by t *within one epoch* are enough for the sum to
//! be released: their contributor bound `ceil(r / (T x days))` (`penrose_core::release`) is at
//! least k, that is r >= (k - 1) x T x days + 1 reports (217 with the defaults k = 10, T = 24 and
//! one-day epochs). The counters of one group are read on the same sampled launches and sealed
//! together, so they are released together; a group stands for its counters. The time given is
//! when the data is in: the design server decrypts the sum once the epoch closes (under the
//! aggregation server's day policy at the end of the following day; at once with
//! `penrose-aggregator close-epoch`). One GPU is one agent, hence one contributor, so covering
//! an application takes reports from at least k GPUs that run it, each sending at most T per
//! (counter, day).
//!
//! That is the daily rule the servers apply today (`--rule daily`, the default). `--rule
//! hourly` models issue 25's proposal instead: an agent seals at most q reports per (counter,
//! hour) (one admission token each, q = 1 by default), and a sum is released the moment its
//! bound reaches k, the bound being the larger of `max over hours h of ceil(r_h / q)` (one
//! credential spends at most q tokens of hour h) and `ceil(r / (q x H))` over the H hours its
//! reports span; a report counts in the hour it was sealed in (its token's) from the moment it
//! arrives. Both bounds are sound against a client that holds every token one credential can
//! get. Under it the simulator also follows each class through successive sums, for the wait from
//! a report's arrival to its sum's release. Not modelled: steering under the hourly rule
//! (refused).
//!
//! Two weaker definitions are computed beside it, to show where the time goes: **reported**
//! (every group has at least one report at the aggregation server, whatever the threshold) and
//! **sampled** (every group has at least one sampled launch somewhere in the fleet: the notion
//! behind P_hit = 1 - (1 - 1/S)^u). Coverage is counted over the applications the fleet runs
//! (of A, those that at least one busy GPU drew; the tables say how many); one that fewer than
//! k GPUs run is never covered.
//!
//! # Model
//!
//! A model, not a replay of launches: each GPU is simulated window by window.
//!
//! - **Fleet** ([`fleet`]): N GPUs, a share `load` of them busy for the whole run, each running
//!   one application drawn from a Zipf popularity over A applications (exponent s, 1 by
//!   default). One GPU is one host with one agent. Applications are classed perfectly (one
//!   class per application: docs/evaluation.md measures 99.3% of snippets in their own class).
//! - **Workload mixes** ([`fleet::Mix`]): an application's mean kernel duration is drawn
//!   log-uniform, and it launches `0.9 / mean` kernels per second (the GPU 90% busy) and at most
//!   200,000 (5 us of host time per launch), steadily, on every GPU that runs it. *Uniform*:
//!   5 us..50 ms for every application (18 to 180,000 launches/s); *small-kernel dominated*:
//!   80% of applications 5..50 us (18,000 to 180,000 launches/s), the rest as uniform;
//!   *large-kernel dominated*: 80% 1..50 ms (18 to 900 launches/s), the rest as uniform.
//! - **Windows** ([`fleet::CaptureModel`]): a window closes at L launches (10,000) or after the
//!   longest window (10 s); the agent's budget scheduler (`penrose_core::schedule`, the same
//!   code the agent runs) computes the gap from the window's probe cost (launches times the
//!   per-launch probe cost, 10 us assumed as in `ProbeCost::ASSUMED`) against the probed
//!   process's CPU time (one core busy by default), with the 0.02% budget, clamped to
//!   60 s..6 h. Each GPU's first window falls uniformly in its first cycle.
//! - **Sampling** ([`gpu::SamplerModel`]): by default the agent's own sampler,
//!   `penrose_core::sampling::SamplingSchedule` (1 in S = 1,000 by countdown, offset re-drawn
//!   every 600 s), run on each window's launches at once (`on_launches`, equal to launch by
//!   launch); or independent Bernoulli(1/S) draws, the P_hit model. The two differ: u launches
//!   from a fresh offset hold a countdown sample with probability min(1, u / S), at least
//!   P_hit (a window of u = S launches always holds one, where P_hit is 0.63; a full window of
//!   L = 10 S exactly 10).
//! - **Counters and reports** ([`gpu`]): a sampled launch reads the counter group active at
//!   the window's start (groups rotate every 600 s from a random phase per GPU); samples go
//!   into that group's histogram when the window closes; a histogram is sealed at 10,000
//!   samples or 300 s after it opened, at most T = 24 per (counter, day) (a histogram over
//!   the cap is held to the next day); a sealed report reaches the aggregation server after a
//!   uniform upload delay of up to 60 s. A report belongs to the epoch of its seal time.
//!
//! Each GPU has its own random stream seeded from (seed, A, GPU index), so a scenario's result
//! depends neither on the thread count nor on the other scenarios of the run; budgets and
//! mixes of one A share the GPUs' draws.
//!
//! The defaults are the agent's (`penrose_core::sampling::DEFAULT_SAMPLE_PERIOD`,
//! `penrose_core::histogram::DEFAULT_SEAL_MAX_AGE`, ...), which were chosen from this
//! simulator; `--sample-period 10000 --seal-max-age-seconds 3600` gives the agent's defaults
//! before that.
//!
//! # Steering by the ack (`--steer`, not in the shipped agent)
//!
//! [`steer`]: the aggregation server's ack to a report tells the agent, per counter group of
//! the report's class, whether this epoch's reports are still short of release; the agent
//! samples that application more (`rate`: 1 in S / f while short, S x f once released), seals
//! it sooner (`seal-age`), or both. That couples the GPUs through the server, so a steered
//! run does not run each GPU alone from start to end: it advances every GPU to the end of a
//! step (`--steer-step-seconds`, 300 s), then counts the reports that reached the server by
//! then per (application, group, epoch); the acks that arrive in the next step carry hints
//! from those counts ([`Fleet::run_steered`]). Within a step GPUs do not interact, so the
//! result still does not depend on the thread count. An unsteered run takes the old path,
//! GPU by GPU, and gives the same results as before steering existed (tested). The cap T and
//! the threshold k are the same with every policy. It was measured from the defaults before
//! (S = 10,000, an hour's seal age); at today's defaults `seal-age` changes nothing (the steered
//! seal age, 300 s, is the default) and `rate` lowers S to 100. The numbers, the cost and the
//! decision (static defaults, no steering) are in docs/evaluation.md, "Steering by the ack".

pub mod cli;
pub mod fleet;
pub mod gpu;
mod output;
mod params;
mod run;
pub mod steer;

pub use output::{svg, table};
pub use params::{Checked, Params, Rule, Scenario, SimulateError};
pub use run::{
    AppTimes, Fleet, LATENCY_GPUS, Latency, Quantiles, ScenarioResult, Simulation, Tally,
};
