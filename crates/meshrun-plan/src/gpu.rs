//! Which physical GPUs a host has, and which of them each worker gets.
//!
//! The rule is simple and strict: every worker receives `per_worker` GPUs of
//! its own, taken in inventory order, and no GPU is ever given to two
//! workers. The inventory honours an existing `CUDA_VISIBLE_DEVICES`, so a
//! scheduler that already restricted the host's GPUs is respected, and the
//! ids handed on are the physical ones (never a renumbered `0..k-1`).

use std::path::Path;

/// Where a host's GPU list came from; it is quoted in error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventorySource {
    /// Parsed from the `CUDA_VISIBLE_DEVICES` the agent inherited.
    VisibleDevices(String),
    /// Found by looking at the machine's NVIDIA device nodes.
    Detected,
}

/// The GPUs one host may hand out, by the id CUDA knows them by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    pub ids: Vec<String>,
    pub source: InventorySource,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error(
        "{workers} workers x --gpus-per-proc {per_worker} need {needed} GPUs on host {host}, \
         but {found} {are} available ({source_text}); lower -n or --gpus-per-proc, or use --platform cpu",
        needed = workers * per_worker,
        are = if *found == 1 { "is" } else { "are" },
    )]
    NotEnough {
        host: u32,
        workers: u32,
        per_worker: u32,
        found: usize,
        source_text: String,
    },
    #[error("CUDA_VISIBLE_DEVICES='{value}' lists GPU '{id}' twice; each GPU may appear once")]
    Duplicate { value: String, id: String },
}

impl Inventory {
    /// Reads the inventory from the current process: `CUDA_VISIBLE_DEVICES`
    /// when set, else the NVIDIA device nodes under `/dev`.
    pub fn discover() -> Result<Self, GpuError> {
        match std::env::var("CUDA_VISIBLE_DEVICES") {
            Ok(value) => Self::from_visible_devices(&value),
            Err(_) => Ok(Self::from_dev_dir(Path::new("/dev"))),
        }
    }

    /// Parses a `CUDA_VISIBLE_DEVICES` value: comma-separated indices or
    /// UUIDs. An empty value means "no GPUs", as CUDA reads it.
    pub fn from_visible_devices(value: &str) -> Result<Self, GpuError> {
        let mut ids: Vec<String> = Vec::new();
        for id in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if ids.iter().any(|seen| seen == id) {
                return Err(GpuError::Duplicate {
                    value: value.to_string(),
                    id: id.to_string(),
                });
            }
            ids.push(id.to_string());
        }
        Ok(Self {
            ids,
            source: InventorySource::VisibleDevices(value.to_string()),
        })
    }

    /// Counts `/dev/nvidiaN` nodes; their numbers are the CUDA indices when
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, which is how workers are started.
    pub fn from_dev_dir(dev: &Path) -> Self {
        let mut numbers: Vec<u32> = std::fs::read_dir(dev)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name();
                name.to_str()?.strip_prefix("nvidia")?.parse::<u32>().ok()
            })
            .collect();
        numbers.sort_unstable();
        Self {
            ids: numbers.iter().map(u32::to_string).collect(),
            source: InventorySource::Detected,
        }
    }

    fn source_text(&self) -> String {
        match &self.source {
            InventorySource::VisibleDevices(v) => format!("CUDA_VISIBLE_DEVICES='{v}'"),
            InventorySource::Detected if self.ids.is_empty() => {
                "no NVIDIA GPU detected and CUDA_VISIBLE_DEVICES unset".to_string()
            }
            InventorySource::Detected => format!("detected: {}", self.ids.join(",")),
        }
    }

    /// Gives each of `workers` workers `per_worker` GPUs of its own.
    pub fn assign(
        &self,
        host: u32,
        workers: u32,
        per_worker: u32,
    ) -> Result<Vec<Vec<String>>, GpuError> {
        let needed = (workers * per_worker) as usize;
        if needed > self.ids.len() {
            return Err(GpuError::NotEnough {
                host,
                workers,
                per_worker,
                found: self.ids.len(),
                source_text: self.source_text(),
            });
        }
        Ok(self.ids[..needed]
            .chunks(per_worker as usize)
            .map(<[String]>::to_vec)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inv(ids: &[&str]) -> Inventory {
        Inventory {
            ids: ids.iter().map(ToString::to_string).collect(),
            source: InventorySource::Detected,
        }
    }

    #[test]
    fn honours_visible_devices_order_and_physical_ids() {
        let inv = Inventory::from_visible_devices("4,5,6,7").unwrap();
        let got = inv.assign(0, 2, 2).unwrap();
        assert_eq!(got, vec![vec!["4", "5"], vec!["6", "7"]]);
    }

    #[test]
    fn uuids_are_passed_through() {
        let inv = Inventory::from_visible_devices("GPU-aa, GPU-bb").unwrap();
        assert_eq!(
            inv.assign(0, 2, 1).unwrap(),
            vec![vec!["GPU-aa"], vec!["GPU-bb"]]
        );
    }

    #[test]
    fn not_enough_names_counts_and_source() {
        let err = inv(&[]).assign(0, 2, 1).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("need 2 GPUs on host 0"), "{text}");
        assert!(text.contains("0 are available"), "{text}");
        assert!(text.contains("no NVIDIA GPU detected"), "{text}");
        let err = Inventory::from_visible_devices("3")
            .unwrap()
            .assign(1, 2, 1)
            .unwrap_err();
        assert!(
            err.to_string().contains("CUDA_VISIBLE_DEVICES='3'"),
            "{err}"
        );
    }

    #[test]
    fn duplicate_visible_device_is_refused() {
        let err = Inventory::from_visible_devices("1,1").unwrap_err();
        assert!(err.to_string().contains("lists GPU '1' twice"));
    }

    #[test]
    fn empty_visible_devices_means_none() {
        assert!(Inventory::from_visible_devices("").unwrap().ids.is_empty());
    }

    #[test]
    fn dev_nodes_are_counted_in_numeric_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "nvidia10",
            "nvidia2",
            "nvidiactl",
            "nvidia-uvm",
            "nvidia0",
            "null",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        assert_eq!(
            Inventory::from_dev_dir(dir.path()).ids,
            vec!["0", "2", "10"]
        );
    }

    proptest! {
        #[test]
        fn never_shares_a_gpu(n_gpus in 0usize..17, workers in 1u32..9, per in 1u32..5) {
            let ids: Vec<String> = (0..n_gpus).map(|i| format!("{}", i * 3 + 1)).collect();
            let inv = Inventory { ids: ids.clone(), source: InventorySource::Detected };
            match inv.assign(0, workers, per) {
                Ok(groups) => {
                    prop_assert_eq!(groups.len(), workers as usize);
                    let mut all: Vec<&String> = groups.iter().flatten().collect();
                    prop_assert!(groups.iter().all(|g| g.len() == per as usize));
                    let total = all.len();
                    all.sort();
                    all.dedup();
                    prop_assert_eq!(all.len(), total, "a GPU was given twice");
                    prop_assert!(all.iter().all(|id| ids.contains(id)));
                }
                Err(_) => prop_assert!((workers * per) as usize > n_gpus),
            }
        }
    }
}
