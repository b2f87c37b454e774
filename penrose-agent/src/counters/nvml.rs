//! GPM metrics through NVML, the counter source of a real NVIDIA GPU.
//!
//! NVML is loaded at run time (`libnvidia-ml.so.1`, through `nvml-wrapper`), so the agent has
//! no link-time dependency on the driver: on a machine without one, [`NvmlSource::open`] fails
//! once with [`NvmlUnavailable`], and the capture that asked for it does not start (there is no
//! fallback to another source; `capture.counters = "none"` runs without counters).
//!
//! GPM (Hopper and later) computes metrics between two samples of the device's counters, so a
//! reading is the device-wide activity over the interval since the previous sampled launch:
//! SM and tensor activity and DRAM bandwidth (group 0, all computed from the same pair of
//! samples, so the joint view of tensor activity against DRAM bandwidth has both from one
//! launch), achieved occupancy (group 2).
//! The first reading only takes the starting sample. Only device 0 is read today; a launch
//! event does not say which device its context is on.

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use penrose_core::counters::{Catalogue, CounterGroup, CounterId};
use penrose_core::gpu::GpuArch;

use super::{CounterSource, CounterValue, MissingReason, Reading};
use crate::capture::events::Launch;

/// The NVML library file the driver installs (the unversioned name belongs to dev packages).
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Catalogue counters GPM provides, by name.
const METRICS: [(&str, GpmMetricId); 4] = [
    ("sm_active", GpmMetricId::SmUtil),
    ("tensor_active", GpmMetricId::AnyTensorUtil),
    ("dram_bandwidth", GpmMetricId::DramBwUtil),
    ("achieved_occupancy", GpmMetricId::SmOccupancy),
];

/// Why NVML cannot be used on this machine.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct NvmlUnavailable {
    what: &'static str,
    #[source]
    source: nvml_wrapper::error::NvmlError,
}

/// GPM readings of device 0.
pub struct NvmlSource {
    nvml: &'static Nvml,
    counters: Vec<(CounterId, CounterGroup, GpmMetricId)>,
    previous: Option<GpmSample<'static>>,
    arch: GpuArch,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("counters", &self.counters.len())
            .finish()
    }
}

impl NvmlSource {
    /// Loads NVML and checks that device 0 supports GPM.
    pub fn open() -> Result<Self, NvmlUnavailable> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(NVML_LIBRARY))
            .init()
            .map_err(|source| NvmlUnavailable {
                what: "loading NVML",
                source,
            })?;
        // The agent holds one NVML for its lifetime; samples borrow it.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let device = nvml.device_by_index(0).map_err(|source| NvmlUnavailable {
            what: "NVML device 0",
            source,
        })?;
        // Taking a sample is the support check that matters: it fails on pre-Hopper parts.
        let first = device.gpm_sample().map_err(|source| NvmlUnavailable {
            what: "GPM sample on device 0",
            source,
        })?;
        let capability = device
            .cuda_compute_capability()
            .map_err(|source| NvmlUnavailable {
                what: "compute capability of device 0",
                source,
            })?;
        let part = |v: i32| u8::try_from(v).unwrap_or(u8::MAX);
        let arch = GpuArch::new(part(capability.major), part(capability.minor));
        let catalogue = Catalogue::current();
        let counters = METRICS
            .iter()
            .filter_map(|(name, metric)| {
                let c = catalogue.counter_by_name(name)?;
                Some((c.id, c.group, *metric))
            })
            .collect();
        Ok(Self {
            nvml,
            counters,
            previous: Some(first),
            arch,
        })
    }
}

impl CounterSource for NvmlSource {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn groups(&self) -> Vec<CounterGroup> {
        super::distinct_groups(self.counters.iter().map(|c| c.1))
    }

    fn arch(&self) -> Option<GpuArch> {
        Some(self.arch)
    }

    fn read(&mut self, _launch: &Launch, group: CounterGroup) -> Reading {
        let wanted: Vec<(CounterId, GpmMetricId)> = self
            .counters
            .iter()
            .filter(|c| c.1 == group)
            .map(|c| (c.0, c.2))
            .collect();
        if wanted.is_empty() {
            return Reading::Missing(MissingReason::GroupNotSupported);
        }
        let sample = match self.nvml.device_by_index(0).and_then(|d| d.gpm_sample()) {
            Ok(sample) => sample,
            Err(e) => {
                tracing::debug!("GPM sample: {e}");
                return Reading::Missing(MissingReason::DeviceError);
            }
        };
        let Some(previous) = self.previous.replace(sample) else {
            return Reading::Missing(MissingReason::Warmup);
        };
        let Some(current) = self.previous.as_ref() else {
            return Reading::Missing(MissingReason::Warmup);
        };
        let ids: Vec<GpmMetricId> = wanted.iter().map(|w| w.1).collect();
        match gpm_metrics_get(self.nvml, &previous, current, &ids) {
            Ok(results) => Reading::Values(
                wanted
                    .iter()
                    .zip(results)
                    .filter_map(|((counter, _), r)| {
                        r.ok().map(|m| CounterValue {
                            counter: *counter,
                            value: m.value,
                        })
                    })
                    .collect(),
            ),
            Err(e) => {
                tracing::debug!("GPM metrics: {e}");
                Reading::Missing(MissingReason::DeviceError)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_an_nvidia_library_opening_fails_once_with_a_reason() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            eprintln!("skipped: this machine has an NVIDIA driver");
            return;
        }
        let err = NvmlSource::open().expect_err("no NVIDIA driver here");
        assert!(err.to_string().starts_with("loading NVML"), "{err}");
    }
}
