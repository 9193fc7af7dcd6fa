//! `Tensor`: a shared buffer and a layout over it.
//!
//! Cloning a tensor is cheap (the buffer is reference-counted) and views (permute, narrow,
//! broadcast) share the buffer; kernels read any layout and write fresh contiguous buffers.

use crate::error::{Result, RtxError};
use rtx_backends::Layout;
use rtx_backends::arena::Region;
use rtx_backends::cpu;
use std::fmt;
use std::sync::Arc;

/// A kernel's output buffer: one from the buffer cache, or a planned arena region.
#[doc(hidden)]
pub enum Buffer {
    Owned(Vec<f32>),
    Arena(Region),
}

impl AsMut<[f32]> for Buffer {
    fn as_mut(&mut self) -> &mut [f32] {
        self.as_mut_slice()
    }
}

impl Buffer {
    /// `region` when it holds exactly `len` values, else a cache buffer of `len`.
    pub fn new(region: Option<Region>, len: usize) -> Buffer {
        match region {
            Some(r) if r.len() == len => Buffer::Arena(r),
            _ => Buffer::Owned(rtx_backends::pool::take(len)),
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            Buffer::Owned(v) => v,
            Buffer::Arena(r) => r.as_mut_slice(),
        }
    }

    pub(crate) fn into_storage(self) -> Storage {
        match self {
            Buffer::Owned(v) => Storage::F32(v),
            Buffer::Arena(r) => Storage::Arena(Some(r)),
        }
    }
}

impl Storage {
    /// The values of f32 storage, wherever they live.
    pub(crate) fn f32_slice(&self) -> Option<&[f32]> {
        match self {
            Storage::F32(v) => Some(v),
            Storage::Arena(r) => Some(r.as_ref().map_or(&[][..], Region::as_slice)),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    I64,
    /// bfloat16 storage (`half::bf16`); see `half.rs` for what reads it.
    BF16,
    /// IEEE half precision storage (`half::f16`).
    F16,
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::I64 => "i64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        })
    }
}

#[derive(Debug)]
pub enum Storage {
    F32(Vec<f32>),
    /// f32 values in a compiled call's planned arena (`rtx_backends::arena`); the region goes
    /// back to its arena when the last tensor reading it drops. (An `Option` only so a kernel
    /// can take the region out to write over it: `Storage` has a `Drop`, so nothing moves out
    /// of it; never `None` in a live tensor.)
    Arena(Option<Region>),
    I64(Vec<i64>),
    BF16(Vec<half::bf16>),
    F16(Vec<half::f16>),
    /// Values on a GPU (`crate::device`).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    Gpu(crate::device::GpuStorage),
}

impl Drop for Storage {
    /// The buffer goes back to the kernels' cache (`rtx_backends::pool`) for the next tensor
    /// of its size.
    fn drop(&mut self) {
        if let Storage::F32(v) = self
            && v.capacity() > 0
        {
            rtx_backends::pool::give_back(std::mem::take(v));
        }
    }
}

/// At most this many spare tensor handles are kept.
const SPARE_HANDLES: usize = 1024;

/// Reference-counted storage handles of dropped tensors (holding empty storage), reused by the
/// next tensors, so a training step after the first allocates no handles either. Shared by
/// all threads: a step may run on a pool thread and hand its results to the caller's thread.
static SPARE: std::sync::Mutex<Vec<Arc<Storage>>> = std::sync::Mutex::new(Vec::new());

/// What a dropping tensor holds while its handle is moved to `SPARE`: one for all threads, so
/// no thread allocates its own the first time it drops a tensor.
static PLACEHOLDER: std::sync::LazyLock<Arc<Storage>> =
    std::sync::LazyLock::new(|| Arc::new(Storage::F32(Vec::new())));

impl Drop for Tensor {
    fn drop(&mut self) {
        if Arc::get_mut(&mut self.storage).is_none() {
            return; // another tensor still reads this buffer
        }
        let mut handle = std::mem::replace(&mut self.storage, Arc::clone(&PLACEHOLDER));
        if let Some(storage) = Arc::get_mut(&mut handle) {
            // The buffer goes back to the kernels' cache here (`Storage::drop`).
            *storage = Storage::F32(Vec::new());
        }
        if let Ok(mut spare) = SPARE.lock()
            && spare.len() < SPARE_HANDLES
        {
            spare.push(handle);
        }
    }
}

/// A handle holding `storage`: a spare one when there is one.
fn handle(storage: Storage) -> Arc<Storage> {
    let spare = SPARE.lock().ok().and_then(|mut spare| spare.pop());
    match spare {
        Some(mut handle) => match Arc::get_mut(&mut handle) {
            Some(slot) => {
                *slot = storage;
                handle
            }
            None => Arc::new(storage),
        },
        None => Arc::new(storage),
    }
}

#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
}

pub(crate) fn fmt_dims(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

pub(crate) fn check_len(len: usize, shape: &[usize], what: &str) -> Result<()> {
    let numel: usize = shape.iter().product();
    if len != numel {
        return Err(RtxError::ShapeMismatch {
            context: what.to_string(),
            expected: format!("{} elements for shape {}", numel, fmt_dims(shape)),
            found: format!("{len} elements"),
        });
    }
    Ok(())
}

impl Tensor {
    pub fn from_vec(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
        check_len(data.len(), shape, "Tensor::from_vec")?;
        Ok(Tensor::from_parts(
            Storage::F32(data),
            Layout::contiguous(shape),
        ))
    }

    pub fn from_i64(data: Vec<i64>, shape: &[usize]) -> Result<Tensor> {
        check_len(data.len(), shape, "Tensor::from_i64")?;
        Ok(Tensor::from_parts(
            Storage::I64(data),
            Layout::contiguous(shape),
        ))
    }

    pub fn scalar(v: f32) -> Tensor {
        Tensor::full(&[], v)
    }

    pub fn zeros(shape: &[usize]) -> Tensor {
        Tensor::full(shape, 0.0)
    }

    pub fn full(shape: &[usize], v: f32) -> Tensor {
        let mut data = rtx_backends::pool::take(shape.iter().product());
        data.fill(v);
        Tensor::from_parts(Storage::F32(data), Layout::contiguous(shape))
    }

    /// A fresh contiguous f32 tensor over a kernel's output buffer; the caller guarantees
    /// its length fits `shape`.
    pub(crate) fn from_buffer(buffer: Buffer, shape: &[usize]) -> Tensor {
        Tensor::from_parts(buffer.into_storage(), Layout::contiguous(shape))
    }

    /// A fresh contiguous f32 tensor; the caller guarantees `data.len()` fits `shape`.
    pub(crate) fn from_kernel(data: Vec<f32>, shape: &[usize]) -> Tensor {
        Tensor::from_parts(Storage::F32(data), Layout::contiguous(shape))
    }

    pub(crate) fn from_parts(storage: Storage, layout: Layout) -> Tensor {
        Tensor {
            storage: handle(storage),
            layout,
        }
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Whether this tensor alone reads its buffer, which holds exactly its elements in order
    /// (so a kernel may write them in place).
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    pub(crate) fn owns_contiguous_buffer(&self) -> bool {
        Arc::strong_count(&self.storage) == 1
            && self.layout.is_contiguous()
            && self.layout.offset == 0
            && match &*self.storage {
                #[cfg(any(feature = "wgpu", feature = "cuda"))]
                Storage::Gpu(s) => s.buffer.len() == self.numel(),
                _ => true,
            }
    }

    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            layout,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    pub fn dtype(&self) -> DType {
        match *self.storage {
            Storage::F32(_) | Storage::Arena(_) => DType::F32,
            Storage::I64(_) => DType::I64,
            Storage::BF16(_) => DType::BF16,
            Storage::F16(_) => DType::F16,
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            Storage::Gpu(ref s) => s.dtype,
        }
    }

    /// The f32 buffer and layout, for kernels.
    /// The elements as one mutable slice, when this tensor alone owns a contiguous f32 buffer:
    /// optimizers update parameters in place through it instead of copying them.
    pub(crate) fn f32_in_place(&mut self) -> Option<&mut [f32]> {
        if !self.layout.is_contiguous() {
            return None;
        }
        let (offset, n) = (self.layout.offset, self.layout.numel());
        match Arc::get_mut(&mut self.storage)? {
            Storage::F32(v) => v.get_mut(offset..offset + n),
            Storage::Arena(Some(r)) => r.as_mut_slice().get_mut(offset..offset + n),
            _ => None,
        }
    }

    /// The elements in row-major order, borrowed when the buffer already holds them so.
    pub(crate) fn f32_contiguous(&self) -> Result<std::borrow::Cow<'_, [f32]>> {
        let (data, layout) = self.f32_parts("f32_contiguous")?;
        Ok(if layout.is_contiguous() {
            std::borrow::Cow::Borrowed(&data[layout.offset..layout.offset + layout.numel()])
        } else {
            std::borrow::Cow::Owned(self.to_vec_f32()?)
        })
    }

    pub fn f32_parts(&self, context: &str) -> Result<(&[f32], &Layout)> {
        self.cpu_only(context)?;
        match self.storage.f32_slice() {
            Some(v) => Ok((v, &self.layout)),
            None => Err(RtxError::DTypeMismatch {
                context: context.to_string(),
                expected: "f32".into(),
                found: self.dtype().to_string(),
            }),
        }
    }

    /// The elements in row-major order (bf16 and f16 ones widened to f32).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        match &*self.storage {
            Storage::BF16(v) => return Ok(self.layout.indices().map(|i| v[i].to_f32()).collect()),
            Storage::F16(v) => return Ok(self.layout.indices().map(|i| v[i].to_f32()).collect()),
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            Storage::Gpu(_) => return crate::gpu::download(self)?.to_vec_f32(),
            _ => {}
        }
        let (d, l) = self.f32_parts("Tensor::to_vec_f32")?;
        Ok(if l.is_contiguous() {
            d[l.offset..l.offset + l.numel()].to_vec()
        } else {
            cpu::to_contiguous(d, l)?
        })
    }

    /// Integer elements in row-major order.
    pub fn to_vec_i64(&self) -> Result<Vec<i64>> {
        match &*self.storage {
            Storage::I64(v) => Ok(self.layout.indices().map(|i| v[i]).collect()),
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            Storage::Gpu(s) if s.dtype == DType::I64 => crate::gpu::download(self)?.to_vec_i64(),
            _ => Err(RtxError::DTypeMismatch {
                context: "Tensor::to_vec_i64".into(),
                expected: "i64".into(),
                found: self.dtype().to_string(),
            }),
        }
    }

    /// Integer elements in row-major order, borrowed when the buffer already holds them so.
    pub(crate) fn i64_contiguous(&self, context: &str) -> Result<std::borrow::Cow<'_, [i64]>> {
        self.cpu_only(context)?;
        match &*self.storage {
            Storage::I64(v) if self.layout.is_contiguous() => Ok(std::borrow::Cow::Borrowed(
                &v[self.layout.offset..self.layout.offset + self.layout.numel()],
            )),
            Storage::I64(v) => Ok(std::borrow::Cow::Owned(
                self.layout.indices().map(|i| v[i]).collect(),
            )),
            _ => Err(RtxError::DTypeMismatch {
                context: context.to_string(),
                expected: "i64".into(),
                found: self.dtype().to_string(),
            }),
        }
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(RtxError::ShapeMismatch {
                context: "Tensor::item".into(),
                expected: "a tensor with one element".into(),
                found: fmt_dims(self.shape()),
            });
        }
        if !self.device().is_cpu() {
            return self.to_vec_f32()?.first().copied().ok_or_else(|| {
                RtxError::Invalid("Tensor::item: a device tensor read back empty".into())
            });
        }
        let (data, layout) = self.f32_parts("Tensor::item")?;
        Ok(data[layout.offset])
    }

    /// Row-major copy if the layout is not contiguous, or a cheap clone.
    ///
    /// # Panics
    /// When the layout reaches past the buffer, which only a view built by `ops::execute` from
    /// arguments that did not pass the op's shape rule can do ([`Tensor::try_contiguous`]
    /// returns that as an error).
    pub fn contiguous(&self) -> Tensor {
        match self.try_contiguous() {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    /// This tensor's buffer, when no other tensor shares it and it holds exactly the elements
    /// in row-major order: a compiled kernel may then write its result over it. Otherwise the
    /// tensor comes back unchanged.
    #[doc(hidden)]
    // The tensor itself comes back on refusal; boxing it would allocate on every step.
    #[allow(clippy::result_large_err)]
    pub fn take_unique_f32(mut self) -> std::result::Result<Buffer, Tensor> {
        if !self.layout.is_contiguous() || self.layout.offset != 0 {
            return Err(self);
        }
        let numel = self.layout.numel();
        match Arc::get_mut(&mut self.storage) {
            Some(Storage::F32(v)) if v.len() == numel => Ok(Buffer::Owned(std::mem::take(v))),
            Some(Storage::Arena(r)) if r.as_ref().map(Region::len) == Some(numel) => {
                match r.take() {
                    Some(r) => Ok(Buffer::Arena(r)),
                    None => Err(self),
                }
            }
            _ => Err(self),
        }
    }

    /// [`Tensor::contiguous`], with a layout that reaches past the buffer as an error.
    pub fn try_contiguous(&self) -> Result<Tensor> {
        if self.layout.is_contiguous() && self.layout.offset == 0 {
            return Ok(self.clone());
        }
        Ok(match &*self.storage {
            Storage::F32(_) | Storage::Arena(_) => {
                let (d, l) = self.f32_parts("Tensor::contiguous")?;
                Tensor::from_kernel(cpu::to_contiguous(d, l)?, self.shape())
            }
            Storage::I64(v) => Tensor::from_parts(
                Storage::I64(self.layout.indices().map(|i| v[i]).collect()),
                Layout::contiguous(self.shape()),
            ),
            Storage::BF16(v) => Tensor::from_parts(
                Storage::BF16(self.layout.indices().map(|i| v[i]).collect()),
                Layout::contiguous(self.shape()),
            ),
            Storage::F16(v) => Tensor::from_parts(
                Storage::F16(self.layout.indices().map(|i| v[i]).collect()),
                Layout::contiguous(self.shape()),
            ),
            #[cfg(any(feature = "wgpu", feature = "cuda"))]
            Storage::Gpu(_) => crate::gpu::contiguous(self)?,
        })
    }

    /// The same elements under a new shape with the same element count.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        check_len(self.numel(), shape, "reshape")?;
        let c = self.try_contiguous()?;
        let mut layout = Layout::contiguous(shape);
        layout.offset = c.layout.offset;
        Ok(c.with_layout(layout))
    }

    /// Largest absolute difference to another f32 tensor of the same shape.
    pub fn max_abs_diff(&self, other: &Tensor) -> Result<f32> {
        if self.shape() != other.shape() {
            return Err(RtxError::ShapeMismatch {
                context: "max_abs_diff".into(),
                expected: fmt_dims(self.shape()),
                found: fmt_dims(other.shape()),
            });
        }
        let (a, b) = (self.to_vec_f32()?, other.to_vec_f32()?);
        Ok(a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max))
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} {}", self.dtype(), fmt_dims(self.shape()))?;
        if self.numel() <= 16 {
            match self.dtype() {
                DType::I64 => write!(f, " {:?}", self.to_vec_i64().unwrap_or_default())?,
                _ => write!(f, " {:?}", self.to_vec_f32().unwrap_or_default())?,
            }
        }
        write!(f, ")")
    }
}
