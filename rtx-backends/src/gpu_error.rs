//! The error of every GPU backend (features `wgpu`, `cuda`): what failed, in words that name
//! the kernel, the size or the library involved.

/// Why a GPU call failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no wgpu adapter found ({0}); on Linux without a GPU, install Mesa's `mesa-vulkan-drivers` (llvmpipe)"
    )]
    NoAdapter(String),
    #[error("cannot open the wgpu device `{adapter}`: {message}")]
    Device { adapter: String, message: String },
    #[error("kernel `{name}` does not compile: {message}")]
    Compile { name: String, message: String },
    #[error("out of GPU memory: {requested} bytes requested")]
    OutOfMemory { requested: u64 },
    #[error("buffer of {requested} bytes exceeds the device's binding limit of {limit} bytes")]
    TooLarge { requested: u64, limit: u64 },
    #[error("kernel `{name}` takes {expected} buffers, {found} were given")]
    Arity {
        name: String,
        expected: usize,
        found: usize,
    },
    #[error("{library} is not installed or not on the library path; {help}")]
    MissingLibrary {
        library: &'static str,
        help: &'static str,
    },
    #[error("GPU call failed: {0}")]
    Call(String),
}

pub type Result<T> = std::result::Result<T, GpuError>;
