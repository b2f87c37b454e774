//! GPM metrics through NVML, the counter source of a real NVIDIA GPU.
//!
//! NVML is loaded at run time (`libnvidia-ml.so.1`, through `nvml-wrapper`), so the agent has
//! no link-time dependency on the driver: on a machine without one, [`NvmlSource::open`] fails
//! once with [`NvmlUnavailable`], and the capture that asked for it does not start (there is no
//! fallback to another source; `capture.counters = "none"` runs without counters).
//!
//! GPM (Hopper and later) computes metrics between two samples of a device's counters, so a
//! reading is the activity of *the launch's GPU* over the interval since that GPU's previous
//! reading: SM and tensor activity and DRAM bandwidth (group 0, all computed from the same pair
//! of samples, so the joint view of tensor activity against DRAM bandwidth has both from one
//! launch), achieved occupancy (group 2). Every GPU of the host is enumerated with its UUID and
//! compute capability (`capture::devices` attributes each sampled launch to one of them); each
//! keeps its own previous sample, and its first reading only takes that sample. A GPU is never
//! sampled faster than [`GPM_MIN_INTERVAL`] (NVML documents 100 ms as GPM's minimum on
//! Hopper): a sampled launch that comes sooner gets no values ([`MissingReason::TooSoon`]).
//! When NVML answers that another client holds the counters (`NVML_ERROR_IN_USE`), the
//! reading is [`MissingReason::CountersBusy`] and the GPU's previous sample is dropped, so the
//! next reading starts afresh once the other tool is done.
//!
//! A GPU in MIG mode runs launches on its instances, not as a whole: it is enumerated as a
//! partitioned GPU (never read) followed by its MIG instances, each with its own UUID, GPU
//! instance id and previous sample, read with NVML's MIG GPM call on its GPU
//! (`nvmlGpmMigSampleGet`), so a launch on one instance is credited with that instance's
//! activity, not its GPU's nor a neighbour's.

use std::time::{Duration, Instant};

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use penrose_core::counters::{Catalogue, CounterGroup, CounterId};
use penrose_core::gpu::GpuArch;

use super::{CounterSource, CounterValue, MissingReason, Reading};
use crate::capture::devices::{DeviceKind, GpuUuid, HostDevice, MigInstance};
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
    source: NvmlError,
}

/// Shortest interval between two GPM samples of one GPU.
pub const GPM_MIN_INTERVAL: Duration = Duration::from_millis(100);

/// One GPU's GPM state.
struct GpmDevice {
    host: HostDevice,
    /// Whether its first sample succeeded (pre-Hopper parts have no GPM).
    gpm: bool,
    previous: Option<(GpmSample<'static>, Instant)>,
}

/// GPM readings of the host's GPUs.
pub struct NvmlSource {
    nvml: &'static Nvml,
    counters: Vec<(CounterId, CounterGroup, GpmMetricId)>,
    devices: Vec<GpmDevice>,
    hosts: Vec<HostDevice>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("counters", &self.counters.len())
            .field("devices", &self.hosts)
            .finish()
    }
}

fn unavailable(what: &'static str) -> impl FnOnce(NvmlError) -> NvmlUnavailable {
    move |source| NvmlUnavailable { what, source }
}

impl NvmlSource {
    /// Loads NVML and enumerates the host's GPUs; fails unless at least one has GPM.
    pub fn open() -> Result<Self, NvmlUnavailable> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(NVML_LIBRARY))
            .init()
            .map_err(unavailable("loading NVML"))?;
        // The agent holds one NVML for its lifetime; samples borrow it.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml
            .device_count()
            .map_err(unavailable("NVML device count"))?;
        let mut devices = Vec::new();
        let mut last_error = None;
        for index in 0..count {
            match Self::enumerate(nvml, index) {
                Ok(found) => devices.extend(found),
                Err(e) => last_error = Some(e),
            }
        }
        if !devices.iter().any(|d| d.gpm) {
            return Err(last_error.unwrap_or(NvmlUnavailable {
                what: "no GPU with GPM",
                source: NvmlError::NotSupported,
            }));
        }
        let catalogue = Catalogue::current();
        let counters = METRICS
            .iter()
            .filter_map(|(name, metric)| {
                let c = catalogue.counter_by_name(name)?;
                Some((c.id, c.group, *metric))
            })
            .collect();
        let hosts = devices.iter().map(|d| d.host).collect();
        Ok(Self {
            nvml,
            counters,
            devices,
            hosts,
        })
    }

    /// One GPU: its UUID, compute capability and a first GPM sample (the support check that
    /// matters: it fails on pre-Hopper parts); a GPU in MIG mode, then each of its instances.
    fn enumerate(nvml: &'static Nvml, index: u32) -> Result<Vec<GpmDevice>, NvmlUnavailable> {
        let device = nvml
            .device_by_index(index)
            .map_err(unavailable("NVML device"))?;
        let uuid = device.uuid().map_err(unavailable("GPU UUID"))?;
        let capability = device
            .cuda_compute_capability()
            .map_err(unavailable("compute capability"))?;
        let part = |v: i32| u8::try_from(v).unwrap_or(u8::MAX);
        let gpu = HostDevice {
            index,
            // A UUID NVML spells otherwise matches no driver answer: its launches are
            // attributed only through the visible-device list.
            uuid: GpuUuid::parse(&uuid).unwrap_or(GpuUuid([0; 16])),
            arch: GpuArch::new(part(capability.major), part(capability.minor)),
            kind: DeviceKind::Whole,
        };
        // NVML_DEVICE_MIG_ENABLE; a GPU without MIG support answers NotSupported.
        if !device.mig_mode().is_ok_and(|mode| mode.current == 1) {
            return Ok(vec![GpmDevice::first(gpu, device.gpm_sample())]);
        }
        let mut found = vec![GpmDevice {
            host: HostDevice {
                kind: DeviceKind::Partitioned,
                ..gpu
            },
            gpm: false,
            previous: None,
        }];
        let slots = device.mig_device_count().unwrap_or(0);
        // Slots without an instance answer NotFound.
        found.extend((0..slots).filter_map(|slot| {
            let instance = device.mig_device_by_index(slot).ok()?;
            let host = mig_instance(nvml, &instance, gpu)?;
            let gpu_instance = host.instance()?.gpu_instance;
            Some(GpmDevice::first(host, device.gpm_mig_sample(gpu_instance)))
        }));
        Ok(found)
    }
}

impl GpmDevice {
    /// A device whose first GPM sample was `first` (an error: no GPM).
    fn first(host: HostDevice, first: Result<GpmSample<'static>, NvmlError>) -> Self {
        let first = first.ok();
        Self {
            host,
            gpm: first.is_some(),
            previous: first.map(|s| (s, Instant::now())),
        }
    }
}

/// A MIG instance of `gpu`, as NVML describes it; `None` when NVML cannot say which GPU and
/// compute instance it is (its launches are then never attributed to it).
fn mig_instance(nvml: &Nvml, instance: &Device<'_>, gpu: HostDevice) -> Option<HostDevice> {
    let uuid = GpuUuid::parse_mig(&instance.uuid().ok()?)?;
    let id = |call: Option<NvmlIdCall>| -> Option<u32> {
        let call = call?;
        let mut id: std::os::raw::c_uint = 0;
        #[allow(unsafe_code)]
        // SAFETY: `instance.handle()` is a MIG device handle NVML gave and that lives as long
        // as `nvml`; `id` is a valid out-pointer for the call's duration.
        let rc = unsafe { call(instance.handle(), &mut id) };
        (rc == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS).then_some(id)
    };
    let lib = nvml.lib();
    let gpu_instance = id(lib.nvmlDeviceGetGpuInstanceId.as_ref().ok().copied())?;
    let compute_instance = id(lib.nvmlDeviceGetComputeInstanceId.as_ref().ok().copied())?;
    Some(HostDevice {
        uuid,
        kind: DeviceKind::Instance(MigInstance {
            parent: gpu.uuid,
            gpu_instance,
            compute_instance,
        }),
        ..gpu
    })
}

/// NVML's `nvmlDeviceGetGpuInstanceId` and `nvmlDeviceGetComputeInstanceId` (nvml-wrapper
/// wraps neither).
type NvmlIdCall = unsafe extern "C" fn(
    nvml_wrapper_sys::bindings::nvmlDevice_t,
    *mut std::os::raw::c_uint,
) -> nvml_wrapper_sys::bindings::nvmlReturn_t;

impl CounterSource for NvmlSource {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn groups(&self) -> Vec<CounterGroup> {
        super::distinct_groups(self.counters.iter().map(|c| c.1))
    }

    fn devices(&self) -> &[HostDevice] {
        &self.hosts
    }

    fn read(&mut self, _launch: &Launch, device: &HostDevice, group: CounterGroup) -> Reading {
        let wanted: Vec<(CounterId, GpmMetricId)> = self
            .counters
            .iter()
            .filter(|c| c.1 == group)
            .map(|c| (c.0, c.2))
            .collect();
        let nvml = self.nvml;
        let Some(state) = self.devices.iter_mut().find(|d| d.host == *device) else {
            return Reading::Missing(MissingReason::DeviceUnknown);
        };
        if wanted.is_empty() || !state.gpm {
            return Reading::Missing(MissingReason::GroupNotSupported);
        }
        if state
            .previous
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() < GPM_MIN_INTERVAL)
        {
            return Reading::Missing(MissingReason::TooSoon);
        }
        let sample =
            match nvml
                .device_by_index(device.index)
                .and_then(|gpu| match device.instance() {
                    Some(instance) => gpu.gpm_mig_sample(instance.gpu_instance),
                    None => gpu.gpm_sample(),
                }) {
                Ok(sample) => sample,
                Err(e) => return missing_for(e, state),
            };
        let Some((previous, _)) = state.previous.replace((sample, Instant::now())) else {
            return Reading::Missing(MissingReason::Warmup);
        };
        let Some((current, _)) = state.previous.as_ref() else {
            return Reading::Missing(MissingReason::Warmup);
        };
        let ids: Vec<GpmMetricId> = wanted.iter().map(|w| w.1).collect();
        match gpm_metrics_get(nvml, &previous, current, &ids) {
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
            Err(e) => missing_for(e, state),
        }
    }
}

/// What an NVML error means for a reading: another client holding the counters is
/// [`MissingReason::CountersBusy`] (and the interval restarts once it lets go), anything else a
/// device error.
fn missing_for(error: NvmlError, state: &mut GpmDevice) -> Reading {
    tracing::debug!("GPM on device {}: {error}", state.host.index);
    match error {
        NvmlError::InUse => {
            state.previous = None;
            Reading::Missing(MissingReason::CountersBusy)
        }
        _ => Reading::Missing(MissingReason::DeviceError),
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
