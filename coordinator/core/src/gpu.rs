//! GPU types: a built-in catalogue plus the types a topology file declares.

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, DataRate, Throughput};

/// A GPU model and the figures the cost model needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuType {
    /// Name used by `gpu = "..."` in domain groups.
    pub name: String,
    /// High-bandwidth memory per GPU.
    pub hbm: ByteSize,
    /// Dense bf16 throughput per GPU.
    pub dense_bf16: Throughput,
    /// Scale-up (NVLink-class) bandwidth per GPU, one direction.
    pub scale_up: DataRate,
    /// The most GPUs one scale-up domain of this type can join (8 for an
    /// HGX board, 72 for an NVL72 rack).
    pub max_domain_gpus: u32,
}

/// The built-in catalogue. Figures are vendor datasheet values for dense
/// bf16 (no sparsity) and per-direction scale-up bandwidth.
pub fn builtin_gpu_types() -> Vec<GpuType> {
    let gpu =
        |name: &str, hbm_gb: u64, decimal: bool, tflops: f64, scale_up_gbytes: u64, domain: u32| {
            GpuType {
                name: name.to_string(),
                hbm: if decimal {
                    ByteSize::from_bytes(hbm_gb * 1_000_000_000)
                } else {
                    ByteSize::from_gib(hbm_gb)
                },
                dense_bf16: Throughput::from_tflops(tflops).unwrap_or_default(),
                scale_up: DataRate::from_gbit_per_second(scale_up_gbytes * 8),
                max_domain_gpus: domain,
            }
        };
    vec![
        gpu("a100", 80, false, 312.0, 300, 8),
        gpu("h100", 80, false, 989.0, 450, 8),
        gpu("h200", 141, true, 989.0, 450, 8),
        gpu("b200", 180, true, 2250.0, 900, 8),
        gpu("gb200", 186, true, 2500.0, 900, 72),
        gpu("gb300", 288, true, 2500.0, 900, 72),
        gpu("mi300x", 192, true, 1307.0, 448, 8),
    ]
}
