//! GPU discovery and sampling behind one trait: [`GpuProvider`]. With the `nvidia` feature the
//! [`Nvml`] provider reads the driver through nvml-wrapper (count, model, memory, driver version,
//! utilization, power, ECC errors); on a machine without the driver it answers "no NVIDIA GPUs:
//! <reason>" — an error value, never a panic — and the agent reports zero GPUs. [`NoGpus`] is the
//! provider without the feature; [`FakeGpus`] serves tests.

use serde::{Deserialize, Serialize};

/// One GPU as the agent reports it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub model: String,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    /// Percent busy over the driver's last sample period.
    pub utilization_pct: u32,
    pub power_w: f64,
    /// Uncorrected ECC errors since the driver loaded (volatile counter); `None` without ECC.
    pub ecc_uncorrected: Option<u64>,
}

/// The node's GPUs and driver.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuReport {
    pub driver_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GpuError {
    /// No driver, no library, no devices, or no permission: the node has no usable NVIDIA GPUs.
    #[error("no NVIDIA GPUs: {0}")]
    Unavailable(String),
    /// The driver answered an error while sampling one device.
    #[error("GPU {index}: {message}")]
    Device { index: u32, message: String },
}

pub trait GpuProvider: Send + Sync {
    fn report(&self) -> Result<GpuReport, GpuError>;
}

/// Built without the `nvidia` feature.
pub struct NoGpus;

impl GpuProvider for NoGpus {
    fn report(&self) -> Result<GpuReport, GpuError> {
        Err(GpuError::Unavailable("built without the `nvidia` feature".into()))
    }
}

/// A fixed report (tests).
pub struct FakeGpus(pub Result<GpuReport, GpuError>);

impl GpuProvider for FakeGpus {
    fn report(&self) -> Result<GpuReport, GpuError> {
        self.0.clone()
    }
}

/// The provider this build has: NVML with the `nvidia` feature, else none.
pub fn default_provider() -> Box<dyn GpuProvider> {
    #[cfg(feature = "nvidia")]
    {
        Box::new(Nvml)
    }
    #[cfg(not(feature = "nvidia"))]
    {
        Box::new(NoGpus)
    }
}

/// What the capabilities carry: count and (first) model, or none when unavailable.
pub fn summary(p: &dyn GpuProvider) -> (u32, Option<String>, Option<String>) {
    let (n, model, driver, _) = summary_with_memory(p);
    (n, model, driver)
}

/// [`summary`] with each GPU's memory (the smallest of them, GiB; `None` without GPUs): the
/// checkpoint broker's size estimate.
pub fn summary_with_memory(p: &dyn GpuProvider) -> (u32, Option<String>, Option<String>, Option<f64>) {
    match p.report() {
        Ok(r) => (
            r.gpus.len() as u32,
            r.gpus.first().map(|g| g.model.clone()),
            r.driver_version,
            r.gpus
                .iter()
                .map(|g| g.memory_total_mib as f64 / 1024.0)
                .reduce(f64::min)
                .map(|g| (g * 10.0).round() / 10.0),
        ),
        Err(_) => (0, None, None, None),
    }
}

/// A local alert rule firing for one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    pub gpu: u32,
    /// `gpu_idle` (utilization below 10 % for 60 s) or `gpu_memory_high` (memory above 95 %).
    pub rule: &'static str,
}

impl std::fmt::Display for Alert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rule {
            "gpu_idle" => write!(f, "gpu{}: utilization below 10% for 60 s", self.gpu),
            _ => write!(f, "gpu{}: memory above 95%", self.gpu),
        }
    }
}

/// The seed's local alert rules over consecutive samples (one per `period_s`): GPU utilization below
/// 10 % for 60 s, GPU memory above 95 %.
pub fn firing(samples: &[GpuReport], period_s: f64) -> Vec<Alert> {
    let mut out = Vec::new();
    let Some(last) = samples.last() else { return out };
    let need = (60.0 / period_s).ceil().max(1.0) as usize;
    for g in &last.gpus {
        let low: usize = samples
            .iter()
            .rev()
            .take_while(|s| s.gpus.iter().any(|x| x.index == g.index && x.utilization_pct < 10))
            .count();
        if low >= need {
            out.push(Alert {
                gpu: g.index,
                rule: "gpu_idle",
            });
        }
        if g.memory_total_mib > 0 && g.memory_used_mib * 100 > g.memory_total_mib * 95 {
            out.push(Alert {
                gpu: g.index,
                rule: "gpu_memory_high",
            });
        }
    }
    out
}

/// [`firing`] as messages.
pub fn alerts(samples: &[GpuReport], period_s: f64) -> Vec<String> {
    firing(samples, period_s).iter().map(ToString::to_string).collect()
}

#[cfg(feature = "nvidia")]
pub use nvml::Nvml;

#[cfg(feature = "nvidia")]
mod nvml {
    use super::*;
    use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};

    /// NVIDIA GPUs through NVML (the library is loaded at run time; its absence is an answer).
    pub struct Nvml;

    impl GpuProvider for Nvml {
        fn report(&self) -> Result<GpuReport, GpuError> {
            let nvml = nvml_wrapper::Nvml::init().map_err(|e| GpuError::Unavailable(e.to_string()))?;
            let count = nvml.device_count().map_err(|e| GpuError::Unavailable(e.to_string()))?;
            let mut gpus = Vec::new();
            for index in 0..count {
                let dev = |e: nvml_wrapper::error::NvmlError| GpuError::Device {
                    index,
                    message: e.to_string(),
                };
                let d = nvml.device_by_index(index).map_err(dev)?;
                let mem = d.memory_info().map_err(dev)?;
                gpus.push(GpuInfo {
                    index,
                    model: d.name().map_err(dev)?,
                    memory_total_mib: mem.total / (1024 * 1024),
                    memory_used_mib: mem.used / (1024 * 1024),
                    utilization_pct: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                    power_w: d.power_usage().map(|mw| mw as f64 / 1000.0).unwrap_or(0.0),
                    ecc_uncorrected: d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
                });
            }
            if gpus.is_empty() {
                return Err(GpuError::Unavailable("the driver reports no devices".into()));
            }
            Ok(GpuReport {
                driver_version: nvml.sys_driver_version().ok(),
                gpus,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, util: u32, used: u64) -> GpuInfo {
        GpuInfo {
            index,
            model: "NVIDIA GH200".into(),
            memory_total_mib: 1000,
            memory_used_mib: used,
            utilization_pct: util,
            power_w: 300.0,
            ecc_uncorrected: Some(0),
        }
    }

    #[test]
    fn the_summary_comes_from_the_provider_and_absence_is_zero() {
        let four = FakeGpus(Ok(GpuReport {
            driver_version: Some("550.54".into()),
            gpus: (0..4).map(|i| gpu(i, 50, 10)).collect(),
        }));
        assert_eq!(summary(&four), (4, Some("NVIDIA GH200".into()), Some("550.54".into())));
        let none = FakeGpus(Err(GpuError::Unavailable("driver not loaded".into())));
        assert_eq!(summary(&none), (0, None, None));
        assert_eq!(summary_with_memory(&four).3, Some(1.0), "1000 MiB each");
        assert_eq!(
            NoGpus.report().unwrap_err().to_string(),
            "no NVIDIA GPUs: built without the `nvidia` feature"
        );
    }

    #[test]
    fn alert_rules_idle_for_a_minute_and_memory_over_95_percent() {
        let sample = |util: u32, used: u64| GpuReport {
            driver_version: None,
            gpus: vec![gpu(0, util, used)],
        };
        // 30 s samples: two idle samples make 60 s.
        let idle = [sample(50, 10), sample(5, 10), sample(3, 10)];
        assert_eq!(alerts(&idle, 30.0), ["gpu0: utilization below 10% for 60 s"]);
        assert!(alerts(&idle[..2], 30.0).is_empty(), "30 s idle is not yet an alert");
        assert_eq!(alerts(&[sample(90, 960)], 30.0), ["gpu0: memory above 95%"]);
        assert!(alerts(&[sample(90, 950)], 30.0).is_empty());
    }

    /// Runs only with `--features nvidia`: on this machine (no driver) NVML answers cleanly; with a
    /// driver it reports at least one GPU with a model and memory.
    #[cfg(feature = "nvidia")]
    #[test]
    fn nvml_reports_gpus_or_cleanly_none() {
        match Nvml.report() {
            Ok(r) => {
                assert!(!r.gpus.is_empty());
                assert!(r.gpus.iter().all(|g| !g.model.is_empty() && g.memory_total_mib > 0));
            }
            Err(e) => assert!(e.to_string().starts_with("no NVIDIA GPUs: "), "{e}"),
        }
    }
}
