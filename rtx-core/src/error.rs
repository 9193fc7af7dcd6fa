//! The one error type of the runtime. Every message says what was expected and what came.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum RtxError {
    /// A tensor's shape does not fit where it was used.
    #[error("shape mismatch in {context}: expected {expected}, found {found}")]
    ShapeMismatch {
        context: String,
        expected: String,
        found: String,
    },
    /// A tensor of the wrong element type.
    #[error("dtype mismatch in {context}: expected {expected}, found {found}")]
    DTypeMismatch {
        context: String,
        expected: String,
        found: String,
    },
    /// A class label or embedding id outside its range.
    #[error("{context}: value {value} at position {index} is outside 0..{limit}")]
    IndexOutOfRange {
        context: String,
        index: usize,
        value: i64,
        limit: usize,
    },
    /// A weights file that cannot be used; the model is left unchanged.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// An op would need more memory than the runtime is willing to allocate.
    #[error("out of memory in {context}: {requested} bytes requested (the limit is {limit} bytes)")]
    OutOfMemory {
        context: String,
        requested: u128,
        limit: u128,
    },
    /// Tensors of one call live on different devices.
    #[error("device mismatch in {context}: expected {expected}, found {found}")]
    DeviceMismatch {
        context: String,
        expected: String,
        found: String,
    },
    /// A GPU backend could not run what was asked (a kernel that did not compile or launch,
    /// an op it has no kernel for yet), in words naming the kernel or op.
    #[error("{0}")]
    Gpu(String),
    /// Anything else the user asked for that cannot be done, worded in full.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = RtxError> = std::result::Result<T, E>;

impl From<rtx_backends::cpu::KernelError> for RtxError {
    fn from(e: rtx_backends::cpu::KernelError) -> Self {
        use rtx_backends::cpu::KernelError;
        match e {
            KernelError::Index {
                kernel,
                position,
                value,
                limit,
            } => RtxError::IndexOutOfRange {
                context: match kernel {
                    "pick" | "pick_grad" => "class labels (cross_entropy) / pick indices".into(),
                    "gather_rows" | "scatter_add_rows" => "embedding ids".into(),
                    _ => format!("`{kernel}` indices"),
                },
                index: position,
                value,
                limit,
            },
            other => RtxError::Invalid(other.to_string()),
        }
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl From<rtx_backends::gpu_error::GpuError> for RtxError {
    fn from(e: rtx_backends::gpu_error::GpuError) -> Self {
        match e {
            rtx_backends::gpu_error::GpuError::OutOfMemory { requested } => RtxError::OutOfMemory {
                context: "GPU buffer".into(),
                requested: requested as u128,
                limit: 0,
            },
            rtx_backends::gpu_error::GpuError::TooLarge { requested, limit } => {
                RtxError::OutOfMemory {
                    context: "GPU buffer (the device's binding limit)".into(),
                    requested: requested as u128,
                    limit: limit as u128,
                }
            }
            other => RtxError::Gpu(other.to_string()),
        }
    }
}
