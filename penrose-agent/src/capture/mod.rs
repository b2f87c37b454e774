//! Live capture of kernel launches through eBPF uprobes on libcuda (DESIGN.md section 3).
//!
//! - [`locate`]: which libcuda files exist (ldconfig, configuration, running processes).
//! - [`loader`]: the committed eBPF object loaded, probes attached and detached.
//! - [`events`]: ring-buffer records decoded; per-process handle names.
//! - [`window`]: capture windows, snippets, the schedule.
//! - [`error`]: why a capture cannot run.
//!
//! [`Capture`] ties them together: it owns the probes and the ring buffer, opens and closes
//! windows, and turns records into snippets.

pub mod error;
pub mod events;
pub mod loader;
pub mod locate;
pub mod window;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aya::maps::{MapData, PerCpuArray, RingBuf};
use penrose_ebpf_common::HandleKind;

pub use error::CaptureError;
use events::{Event, Pid, ProcessNames};
use loader::Probes;
use locate::{LibraryFile, LibrarySources};
use window::{Schedule, Snippet, Window};

/// How a capture runs.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Where to look for libcuda.
    pub sources: LibrarySources,
    /// L: launches per process per window.
    pub window_launches: usize,
    /// How long the reader sleeps when the ring is empty. Records are submitted without a
    /// wake-up (a wake-up per launch would cost more than the probe), so this bounds the
    /// latency and, with the ring's size, the launch rate the agent keeps up with.
    pub poll_interval: Duration,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            sources: LibrarySources::default(),
            window_launches: window::DEFAULT_WINDOW_LAUNCHES,
            poll_interval: Duration::from_millis(1),
        }
    }
}

/// What the reader has seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// Records read from the ring.
    pub events: u64,
    /// Launch records.
    pub launches: u64,
    /// Launch records that arrived with no window open (none are expected).
    pub launches_outside_window: u64,
    /// Name and kernel-function records.
    pub names: u64,
    /// Exit records of any process.
    pub exits: u64,
    /// Records that did not decode.
    pub malformed: u64,
    /// Windows opened.
    pub windows: u64,
}

/// A running capture.
pub struct Capture {
    config: CaptureConfig,
    probes: Probes,
    ring: RingBuf<MapData>,
    drops: PerCpuArray<MapData, u64>,
    names: HashMap<Pid, ProcessNames>,
    window: Option<Window>,
    finished: Vec<Snippet>,
    counts: Counts,
    beyond_limit: u64,
}

impl Capture {
    /// Loads the probes, attaches the name probes to every libcuda found and the exit
    /// tracepoint. Finding no library is not an error: [`Capture::rescan`] looks again.
    pub fn start(config: CaptureConfig) -> Result<Self, CaptureError> {
        let mut probes = Probes::load()?;
        let (ring, drops) = probes.take_maps()?;
        let mut capture = Self {
            config,
            probes,
            ring,
            drops,
            names: HashMap::new(),
            window: None,
            finished: Vec::new(),
            counts: Counts::default(),
            beyond_limit: 0,
        };
        capture.rescan()?;
        if capture.libraries().is_empty() {
            tracing::warn!("no libcuda found yet; looking again at each window");
        }
        Ok(capture)
    }

    /// Looks for libcuda files again (new containers) and probes the new ones.
    pub fn rescan(&mut self) -> Result<usize, CaptureError> {
        let mut added = 0;
        for library in locate::locate(&self.config.sources) {
            if !self.probes.libraries().iter().any(|l| l.id == library.id) {
                self.probes.add_library(library)?;
                added += 1;
            }
        }
        Ok(added)
    }

    /// The libraries being probed.
    pub fn libraries(&self) -> &[LibraryFile] {
        self.probes.libraries()
    }

    /// Whether a window is open.
    pub fn window_open(&self) -> bool {
        self.window.is_some()
    }

    /// Opens a window: launch probes attached.
    pub fn open_window(&mut self) -> Result<(), CaptureError> {
        if self.window.is_some() {
            return Ok(());
        }
        self.drain();
        self.window = Some(Window::new(
            self.counts.windows,
            self.config.window_launches,
        ));
        self.counts.windows += 1;
        let started = Instant::now();
        let attached = self.probes.attach_launch()?;
        tracing::debug!(
            "window opened: {attached} launch probes in {:?}",
            started.elapsed()
        );
        Ok(())
    }

    /// Closes the window: launch probes detached, the ring drained of what they wrote, every
    /// open snippet ended.
    pub fn close_window(&mut self) -> Result<(), CaptureError> {
        if self.window.is_none() {
            return Ok(());
        }
        let started = Instant::now();
        let detaching = self.probes.detach_launch()?;
        // Keep draining: launches trap until the kernel has unregistered every probe.
        while !detaching.is_done() {
            if self.drain() == 0 {
                std::thread::sleep(self.config.poll_interval);
            }
        }
        detaching.wait();
        tracing::debug!(
            "window closed: launch probes detached in {:?}",
            started.elapsed()
        );
        self.drain();
        if let Some(window) = self.window.take() {
            self.beyond_limit += window.beyond_limit();
            self.finished.extend(window.close());
        }
        Ok(())
    }

    /// Reads every record now in the ring; returns how many.
    pub fn drain(&mut self) -> u64 {
        let mut read = 0u64;
        loop {
            let event = match self.ring.next() {
                Some(item) => events::decode(&item),
                None => break,
            };
            read += 1;
            match event {
                Some(event) => self.handle(event),
                None => self.counts.malformed += 1,
            }
        }
        self.counts.events += read;
        if let Some(window) = &mut self.window {
            self.finished.extend(window.take_finished());
        }
        read
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Launch(launch) => {
                self.counts.launches += 1;
                let Some(window) = &mut self.window else {
                    self.counts.launches_outside_window += 1;
                    return;
                };
                let name = self
                    .names
                    .get(&launch.pid)
                    .and_then(|n| n.function(launch.function));
                window.record(&launch, name);
            }
            Event::Name {
                pid,
                kind,
                handle,
                name,
                truncated,
            } => {
                self.counts.names += 1;
                if truncated {
                    tracing::debug!("pid {}: kernel name cut at {} bytes", pid.0, name.len());
                }
                self.names
                    .entry(pid)
                    .or_default()
                    .learn(kind, handle, &name);
            }
            Event::KernelFunction {
                pid,
                kernel,
                function,
            } => {
                self.counts.names += 1;
                let names = self.names.entry(pid).or_default();
                if !names.link(kernel, function) {
                    tracing::debug!("pid {}: kernel {kernel:#x} has no name", pid.0);
                    names.learn(HandleKind::Function, function, window::UNNAMED);
                }
            }
            Event::Exit { pid } => {
                self.counts.exits += 1;
                self.names.remove(&pid);
                if let Some(window) = &mut self.window {
                    window.exit(pid);
                }
            }
        }
    }

    /// Drains until `until` returns true, sleeping the poll interval whenever the ring is
    /// empty.
    pub fn poll_until(&mut self, mut until: impl FnMut(&mut Self) -> bool) {
        loop {
            if self.drain() == 0 {
                if until(self) {
                    return;
                }
                std::thread::sleep(self.config.poll_interval);
            }
        }
    }

    /// Runs windows on `schedule` for `total`, then closes any open window.
    pub fn run_for(&mut self, total: Duration, schedule: &Schedule) -> Result<(), CaptureError> {
        let start = Instant::now();
        loop {
            let elapsed = start.elapsed();
            if elapsed >= total {
                break;
            }
            let open = schedule.is_open_at(elapsed);
            if open && !self.window_open() {
                self.rescan()?;
                self.open_window()?;
            } else if !open && self.window_open() {
                self.close_window()?;
            }
            if self.drain() == 0 {
                std::thread::sleep(self.config.poll_interval);
            }
        }
        self.close_window()
    }

    /// Snippets that have ended since the last call.
    pub fn take_snippets(&mut self) -> Vec<Snippet> {
        std::mem::take(&mut self.finished)
    }

    /// Records the BPF side could not put into the full ring, summed over CPUs.
    pub fn drops(&self) -> Result<u64, CaptureError> {
        let values = self.drops.get(&0, 0).map_err(CaptureError::Map)?;
        Ok(values.iter().sum())
    }

    /// Run-time statistics of every program (zero unless enabled with
    /// [`loader::enable_run_stats`]).
    pub fn run_stats(&self) -> Vec<loader::ProgramStats> {
        self.probes.run_stats()
    }

    /// Counts so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Launches ignored because their process had reached L in a closed window.
    pub fn beyond_limit(&self) -> u64 {
        self.beyond_limit
    }
}
