//! Where a tensor lives: [`Device::Cpu`], or a wgpu adapter (`Device::Wgpu`, cargo feature
//! `wgpu`: Vulkan, Metal, DX12, and Mesa's llvmpipe where there is no GPU).
//!
//! A tensor on a device holds a device buffer and the same `Layout` as a CPU tensor, so view
//! ops (permute, narrow, broadcast, reshape of contiguous values) stay views there too.
//! `Tensor::to(&device)` copies between devices; `Module::to` moves a model's parameters;
//! a compiled graph function whose inputs are on a device runs there (`crate::gpu`).

use crate::error::{Result, RtxError};
use crate::tensor::Tensor;
#[cfg(feature = "wgpu")]
use crate::tensor::{DType, Storage};
use std::fmt;

#[cfg(feature = "wgpu")]
use std::sync::Arc;

/// A place tensors live and kernels run.
#[derive(Clone)]
pub enum Device {
    Cpu,
    /// A wgpu adapter, shared by every tensor on it.
    #[cfg(feature = "wgpu")]
    Wgpu(Arc<rtx_backends::wgpu::WgpuDevice>),
}

impl Device {
    /// The process's wgpu device: the first adapter wgpu finds (llvmpipe on a machine without
    /// a GPU), opened once and shared by every later call.
    #[cfg(feature = "wgpu")]
    pub fn wgpu() -> Result<Device> {
        use std::sync::OnceLock;
        static OPENED: OnceLock<std::result::Result<Arc<rtx_backends::wgpu::WgpuDevice>, String>> =
            OnceLock::new();
        match OPENED.get_or_init(|| {
            rtx_backends::wgpu::WgpuDevice::open()
                .map(Arc::new)
                .map_err(|e| e.to_string())
        }) {
            Ok(d) => Ok(Device::Wgpu(Arc::clone(d))),
            Err(e) => Err(RtxError::Gpu(e.clone())),
        }
    }

    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            #[cfg(feature = "wgpu")]
            (Device::Wgpu(a), Device::Wgpu(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "wgpu")]
            _ => false,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(d) => write!(f, "wgpu:{}", d.describe()),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A tensor's buffer on a wgpu device. f32 values are stored as they are; i64 values (class
/// labels, token ids) as 32-bit words, with the i64 values also kept on the host so that
/// index checks (a label past the class count) run before any kernel reads them.
#[cfg(feature = "wgpu")]
pub struct GpuStorage {
    pub(crate) device: Arc<rtx_backends::wgpu::WgpuDevice>,
    pub(crate) buffer: rtx_backends::wgpu::GpuBuffer,
    pub(crate) dtype: DType,
    pub(crate) host_i64: Option<Vec<i64>>,
}

#[cfg(feature = "wgpu")]
impl fmt::Debug for GpuStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GpuStorage({} {} values on {})",
            self.dtype,
            self.buffer.len(),
            self.device.describe()
        )
    }
}

impl Tensor {
    /// The device holding this tensor's values.
    pub fn device(&self) -> Device {
        #[cfg(feature = "wgpu")]
        if let Storage::Wgpu(s) = self.storage() {
            return Device::Wgpu(Arc::clone(&s.device));
        }
        Device::Cpu
    }

    /// This tensor's values on `device` (the same tensor when it is already there). Copies
    /// to a device keep the layout's elements only, contiguously.
    pub fn to(&self, device: &Device) -> Result<Tensor> {
        if self.device() == *device {
            return Ok(self.clone());
        }
        match device {
            Device::Cpu => self.to_cpu(),
            #[cfg(feature = "wgpu")]
            Device::Wgpu(d) => {
                let on_cpu = self.to_cpu()?;
                upload(d, &on_cpu)
            }
        }
    }

    fn to_cpu(&self) -> Result<Tensor> {
        #[cfg(feature = "wgpu")]
        if let Storage::Wgpu(_) = self.storage() {
            return crate::gpu::download(self);
        }
        Ok(self.clone())
    }

    /// An error naming this tensor's device when it is not on the CPU (for CPU kernels).
    pub(crate) fn cpu_only(&self, context: &str) -> Result<()> {
        if self.device().is_cpu() {
            return Ok(());
        }
        Err(RtxError::DeviceMismatch {
            context: context.to_string(),
            expected: "a tensor on the cpu".into(),
            found: format!(
                "one on {}; move it with `.to(&Device::Cpu)`, or move its other operands to that device",
                self.device()
            ),
        })
    }
}

#[cfg(feature = "wgpu")]
fn upload(d: &Arc<rtx_backends::wgpu::WgpuDevice>, t: &Tensor) -> Result<Tensor> {
    let (buffer, host_i64, dtype) = match t.dtype() {
        DType::I64 => {
            let values = t.to_vec_i64()?;
            let words = values
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    u32::try_from(v).map_err(|_| RtxError::IndexOutOfRange {
                        context: "an i64 tensor moved to a GPU (indices are stored as u32 there)"
                            .into(),
                        index: i,
                        value: v,
                        limit: u32::MAX as usize,
                    })
                })
                .collect::<Result<Vec<u32>>>()?;
            (d.upload_u32(&words)?, Some(values), DType::I64)
        }
        DType::F32 => (d.upload_f32(&t.to_vec_f32()?)?, None, DType::F32),
        half => {
            return Err(RtxError::DTypeMismatch {
                context: "Tensor::to a GPU".into(),
                expected: "f32 or i64 (half precision is not stored on GPUs yet)".into(),
                found: half.to_string(),
            });
        }
    };
    Ok(Tensor::from_parts(
        Storage::Wgpu(GpuStorage {
            device: Arc::clone(d),
            buffer,
            dtype,
            host_i64,
        }),
        rtx_backends::Layout::contiguous(t.shape()),
    ))
}
