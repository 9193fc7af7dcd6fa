//! Where a tensor lives: [`Device::Cpu`], or a GPU ([`Device::Gpu`]): a wgpu adapter
//! (`Device::wgpu()`, cargo feature `wgpu`: Vulkan, Metal, DX12, and Mesa's llvmpipe where
//! there is no GPU), a CUDA device (`Device::cuda(i)`, cargo feature `cuda`) or an AMD GPU
//! through HIP (`Device::hip(i)`, cargo feature `hip`: the CUDA device's kernels, compiled by
//! hiprtc).
//!
//! A tensor on a GPU holds a device buffer and the same `Layout` as a CPU tensor, so view
//! ops (permute, narrow, broadcast, reshape of contiguous values) stay views there too.
//! `Tensor::to(&device)` copies between devices; `Module::to` moves a model's parameters;
//! a compiled graph function whose inputs are on a GPU runs there (`crate::gpu`), with the
//! kernels its backend runs (`rtx_backends::gpu::Gpu`).

use crate::error::{Result, RtxError};
use crate::tensor::Tensor;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
use crate::tensor::{DType, Storage};
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use rtx_backends::gpu::Gpu;
use std::fmt;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use std::sync::Arc;

/// A place tensors live and kernels run.
#[derive(Clone)]
pub enum Device {
    Cpu,
    /// A GPU, shared by every tensor on it: [`Device::wgpu`], [`Device::cuda`] or
    /// `Device::hip`.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    Gpu(Arc<Gpu>),
}

impl Device {
    /// The process's wgpu device: the first adapter wgpu finds (llvmpipe on a machine without
    /// a GPU), opened once and shared by every later call.
    #[cfg(feature = "wgpu")]
    pub fn wgpu() -> Result<Device> {
        static OPENED: OpenedOnce = OpenedOnce::new();
        opened_once(&OPENED, || {
            rtx_backends::wgpu::WgpuDevice::open().map(Gpu::Wgpu)
        })
    }

    /// CUDA device `ordinal` (0 for the first GPU), opened once per process and shared by
    /// every later call. Without a driver, cuBLAS or a GPU this is an error saying which is
    /// missing.
    #[cfg(feature = "cuda")]
    pub fn cuda(ordinal: usize) -> Result<Device> {
        static OPENED: OpenedByOrdinal = OpenedByOrdinal::new(Vec::new());
        opened_by_ordinal(&OPENED, ordinal, "CUDA", || {
            rtx_backends::cuda::CudaDevice::open(ordinal).map(Gpu::Cuda)
        })
    }

    /// AMD GPU `ordinal` (0 for the first) through the HIP runtime, opened once per process
    /// and shared by every later call: the CUDA device's kernels compiled by hiprtc, and a
    /// tiled GEMM of our own for products. Without ROCm's `libamdhip64.so.5` or an AMD GPU
    /// this is an error saying which is missing.
    #[cfg(feature = "hip")]
    pub fn hip(ordinal: usize) -> Result<Device> {
        static OPENED: OpenedByOrdinal = OpenedByOrdinal::new(Vec::new());
        opened_by_ordinal(&OPENED, ordinal, "HIP", || {
            rtx_backends::cuda::CudaDevice::open_hip(ordinal).map(Gpu::Cuda)
        })
    }

    /// A CUDA device whose kernels run on this CPU (`CudaDevice::on_cpu`: the same CUDA C
    /// built by the host's `c++` and run thread by thread, the CPU's GEMM for cuBLAS's),
    /// opened once per process. A test device: it runs everything `Device::cuda` runs above
    /// the driver, so the CUDA path is checked on machines without a GPU; it is slow.
    #[cfg(feature = "cuda")]
    pub fn cuda_on_cpu() -> Result<Device> {
        static OPENED: OpenedOnce = OpenedOnce::new();
        opened_once(&OPENED, || {
            rtx_backends::cuda::CudaDevice::on_cpu().map(Gpu::Cuda)
        })
    }

    /// [`Device::cuda_on_cpu`] with every product run by the tiled GEMM kernel a HIP device
    /// runs (`CudaDevice::on_cpu_as_hip`), so `Device::hip`'s kernels are checked on the CPU.
    #[cfg(feature = "cuda")]
    pub fn hip_on_cpu() -> Result<Device> {
        static OPENED: OpenedOnce = OpenedOnce::new();
        opened_once(&OPENED, || {
            rtx_backends::cuda::CudaDevice::on_cpu_as_hip().map(Gpu::Cuda)
        })
    }

    pub fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu)
    }

    /// The GPU behind this device, if it is one.
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    pub fn gpu(&self) -> Option<&Arc<Gpu>> {
        match self {
            Device::Gpu(g) => Some(g),
            Device::Cpu => None,
        }
    }
}

/// A device opened at most once per process (its opening's error kept as text).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
type OpenedOnce = std::sync::OnceLock<std::result::Result<Arc<Gpu>, String>>;

/// The device in `cell`, opened by `open` on the first call.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn opened_once<E: fmt::Display>(
    cell: &'static OpenedOnce,
    open: impl FnOnce() -> std::result::Result<Gpu, E>,
) -> Result<Device> {
    match cell.get_or_init(|| open().map(Arc::new).map_err(|e| e.to_string())) {
        Ok(d) => Ok(Device::Gpu(Arc::clone(d))),
        Err(e) => Err(RtxError::Gpu(e.clone())),
    }
}

/// Devices opened so far, by ordinal.
#[cfg(feature = "cuda")]
type OpenedByOrdinal = std::sync::Mutex<Vec<(usize, Arc<Gpu>)>>;

/// Device `ordinal` of `table` (`what` names the kind in errors), opened by `open` the first
/// time it is asked for; a failed opening is tried again on the next call.
#[cfg(feature = "cuda")]
fn opened_by_ordinal<E>(
    table: &'static OpenedByOrdinal,
    ordinal: usize,
    what: &str,
    open: impl FnOnce() -> std::result::Result<Gpu, E>,
) -> Result<Device>
where
    RtxError: From<E>,
{
    let mut opened = table
        .lock()
        .map_err(|_| RtxError::Gpu(format!("the {what} device table was poisoned")))?;
    if let Some((_, d)) = opened.iter().find(|(i, _)| *i == ordinal) {
        return Ok(Device::Gpu(Arc::clone(d)));
    }
    let d = Arc::new(open()?);
    opened.push((ordinal, Arc::clone(&d)));
    Ok(Device::Gpu(d))
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        match (self, other) {
            (Device::Cpu, Device::Cpu) => true,
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            (Device::Gpu(a), Device::Gpu(b)) => Arc::ptr_eq(a, b),
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            _ => false,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            Device::Gpu(d) => f.write_str(&d.describe()),
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A tensor's buffer on a GPU. f32 values are stored as they are; i64 values (class
/// labels, token ids) as 32-bit words, with the i64 values also kept on the host so that
/// index checks (a label past the class count) run before any kernel reads them.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub struct GpuStorage {
    pub(crate) device: Arc<Gpu>,
    pub(crate) buffer: rtx_backends::gpu::DeviceBuffer,
    pub(crate) dtype: DType,
    pub(crate) host_i64: Option<Vec<i64>>,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
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
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let Storage::Gpu(s) = self.storage() {
            return Device::Gpu(Arc::clone(&s.device));
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
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            Device::Gpu(d) => {
                let on_cpu = self.to_cpu()?;
                upload(d, &on_cpu)
            }
        }
    }

    fn to_cpu(&self) -> Result<Tensor> {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let Storage::Gpu(_) = self.storage() {
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

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn upload(d: &Arc<Gpu>, t: &Tensor) -> Result<Tensor> {
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
        Storage::Gpu(GpuStorage {
            device: Arc::clone(d),
            buffer,
            dtype,
            host_i64,
        }),
        rtx_backends::Layout::contiguous(t.shape()),
    ))
}
