//! Products on a [`CudaDevice`]: row-major operands (strided, transposed, batched) as
//! cuBLAS's column-major calls, f32 (`cublasSgemm`) and bf16 on the tensor cores
//! (`cublasGemmEx`), and [`CudaDevice::matmul`], the wgpu backend's matmul over strided views.
//! Every call's matrices are checked to lie inside their buffers before cuBLAS reads them.

use cudarc::driver::DevicePtr;

use super::kernels::CudaView;
use super::runtime::{CudaBuffer, CudaDevice, Runner};
use super::{GpuError, Result};

/// A row-major product `C[m, n] = A[m, k] @ B[k, n]` for cuBLAS, `batches` times with the
/// given element strides between matrices (0: one matrix for every batch). `a_transposed`:
/// A is stored as `[k, m]`; `b_transposed`: B as `[n, k]` (a Linear's weight). C is
/// written densely.
#[derive(Clone, Copy, Debug)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
    pub batches: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
    /// Elements between consecutive rows of A as stored; `None`: dense (its row length).
    pub a_row_stride: Option<usize>,
    pub b_row_stride: Option<usize>,
    /// Elements before A's and B's first matrix in their buffers.
    pub a_offset: usize,
    pub b_offset: usize,
}

impl GemmShape {
    /// A's and B's stored `[rows, cols]` and leading dimensions (the row stride, at least a
    /// row long): what cuBLAS is told and what the CPU stand-in reads.
    pub(super) fn stored(&self) -> [(usize, usize, usize); 2] {
        let (m, n, k) = (self.m, self.n, self.k);
        let (a_rows, a_cols) = if self.a_transposed { (k, m) } else { (m, k) };
        let (b_rows, b_cols) = if self.b_transposed { (n, k) } else { (k, n) };
        let ld = |stride: Option<usize>, cols: usize| stride.unwrap_or(cols).max(cols).max(1);
        [
            (a_rows, a_cols, ld(self.a_row_stride, a_cols)),
            (b_rows, b_cols, ld(self.b_row_stride, b_cols)),
        ]
    }

    /// One product of contiguous row-major matrices.
    pub fn plain(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape {
            m,
            n,
            k,
            a_transposed: false,
            b_transposed: false,
            batches: 1,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            a_row_stride: None,
            b_row_stride: None,
            a_offset: 0,
            b_offset: 0,
        }
    }
}

impl CudaDevice {
    /// `c = a @ b` in f32 through cuBLAS (`cublasSgemm`, strided-batched for several).
    pub fn gemm_f32(
        &self,
        shape: GemmShape,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &CudaBuffer,
    ) -> Result<()> {
        use cudarc::cublas::result;
        let s = check_gemm(shape, a.len(), b.len(), c.len())?;
        let d = match self.runner() {
            Runner::Driver(d) => d,
            Runner::Host(h) if h.tiled_gemm() => return self.gemm_f32_tiled(shape, a, b, c),
            Runner::Host(h) => return h.gemm_f32(shape, a, b, c),
            #[cfg(feature = "hip")]
            Runner::Hip(_) => return self.gemm_f32_tiled(shape, a, b, c),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (pa, _ra) = a.device_slice()?.device_ptr(&d.stream);
        let (pb, _rb) = b.device_slice()?.device_ptr(&d.stream);
        let (pc, _rc) = c.device_slice()?.device_ptr(&d.stream);
        let first = (pb + 4 * shape.b_offset as u64) as *const f32;
        let second = (pa + 4 * shape.a_offset as u64) as *const f32;
        let handle = *d.blas.handle();
        // SAFETY: `check_gemm` checked that every matrix of every batch lies inside its
        // buffer at these offsets, leading dimensions and strides; the pointers stay valid
        // while the guards live, and cuBLAS runs on the device's one stream.
        let done = unsafe {
            if shape.batches == 1 {
                result::sgemm(
                    handle,
                    s.op_first,
                    s.op_second,
                    s.m,
                    s.n,
                    s.k,
                    &alpha,
                    first,
                    s.ld_first,
                    second,
                    s.ld_second,
                    &beta,
                    pc as *mut f32,
                    s.ldc,
                )
            } else {
                result::sgemm_strided_batched(
                    handle,
                    s.op_first,
                    s.op_second,
                    s.m,
                    s.n,
                    s.k,
                    &alpha,
                    first,
                    s.ld_first,
                    shape.stride_b as i64,
                    second,
                    s.ld_second,
                    shape.stride_a as i64,
                    &beta,
                    pc as *mut f32,
                    s.ldc,
                    shape.stride_c as i64,
                    s.batches,
                )
            }
        };
        done.map_err(|e| GpuError::Call(format!("cublasSgemm: {e:?}")))
    }

    /// `out = a @ b` for `[batches, m, k]` and `[batches, k, n]` views (a batch stride of 0
    /// broadcasts), `out` holding `batches * m * n` values written contiguously: the wgpu
    /// backend's `matmul`. A view cuBLAS cannot read in place (neither of its last two
    /// strides 1) is copied out densely first.
    pub fn matmul(&self, a: &CudaView, b: &CudaView, out: &CudaBuffer) -> Result<()> {
        let (Some(&[batches, m, k]), Some(&[b_batches, k2, n])) = (
            a.shape.get(..3).filter(|_| a.shape.len() == 3),
            b.shape.get(..3).filter(|_| b.shape.len() == 3),
        ) else {
            return Err(GpuError::Call(format!(
                "matmul takes [batch, m, k] and [batch, k, n] views, found {:?} and {:?}",
                a.shape, b.shape
            )));
        };
        if a.strides.len() != 3 || b.strides.len() != 3 {
            return Err(GpuError::Call(format!(
                "matmul views need a stride per axis, found {:?} and {:?}",
                a.strides, b.strides
            )));
        }
        let outputs = batches.checked_mul(m).and_then(|v| v.checked_mul(n));
        if k != k2 || b_batches != batches || outputs.is_none_or(|o| out.len() < o) {
            return Err(GpuError::Call(format!(
                "matmul operands {:?} @ {:?} do not fit an output of {}",
                a.shape,
                b.shape,
                out.len()
            )));
        }
        if batches * m * n == 0 {
            return Ok(());
        }
        if k == 0 {
            return self.fill_zero(out, batches * m * n);
        }
        let dense_a;
        let (a, (a_transposed, a_ld)) = match stored_as(m, k, a.strides[1], a.strides[2]) {
            Some(s) => (a, s),
            None => {
                dense_a = self.dense(a)?;
                (&dense_a.view(), (false, k))
            }
        };
        let dense_b;
        let (b, (b_transposed, b_ld)) = match stored_as(k, n, b.strides[1], b.strides[2]) {
            Some(s) => (b, s),
            None => {
                dense_b = self.dense(b)?;
                (&dense_b.view(), (false, n))
            }
        };
        let batch_stride = |v: &CudaView| if batches == 1 { 0 } else { v.strides[0] };
        let shape = GemmShape {
            a_transposed,
            b_transposed,
            batches,
            stride_a: batch_stride(a),
            stride_b: batch_stride(b),
            a_row_stride: Some(a_ld),
            b_row_stride: Some(b_ld),
            a_offset: a.offset,
            b_offset: b.offset,
            ..GemmShape::plain(m, n, k)
        };
        self.gemm_f32(shape, a.buffer, b.buffer, out)
    }

    /// `view`'s values copied into a dense buffer of their own.
    fn dense(&self, view: &CudaView) -> Result<Dense> {
        let n: usize = view.shape.iter().product();
        let buffer = self.zeros(n)?;
        let strides = crate::Layout::contiguous(&view.shape).strides.to_vec();
        self.copy_into(view, &buffer, 0, &strides)?;
        Ok(Dense {
            buffer,
            shape: view.shape.clone(),
            strides,
        })
    }

    /// Zeros into the first `len` words of `buf` (a product over an empty K).
    fn fill_zero(&self, buf: &CudaBuffer, len: usize) -> Result<()> {
        let zeros = self.zeros(len)?;
        let view = |b| CudaView {
            buffer: b,
            offset: 0,
            shape: vec![len],
            strides: vec![1],
        };
        self.copy_into(&view(&zeros), buf, 0, &view(buf).strides)
    }

    /// `c = a @ b` with bf16 operands and result (raw bf16 bits, two per word) and f32
    /// accumulation, on the tensor cores (`cublasGemmEx`, `CUBLAS_COMPUTE_32F`): what
    /// `torch.matmul` runs for bfloat16 tensors.
    pub fn gemm_bf16(
        &self,
        shape: GemmShape,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &CudaBuffer,
    ) -> Result<()> {
        use cudarc::cublas::{result, sys};
        let s = check_gemm(shape, a.len() * 2, b.len() * 2, c.len() * 2)?;
        if shape.batches != 1 {
            return Err(GpuError::Call(
                "batched bf16 products are not supported yet".into(),
            ));
        }
        let Runner::Driver(d) = self.runner() else {
            return Err(GpuError::Call(format!(
                "bf16 products need cuBLAS, which {} has not",
                self.describe()
            )));
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (pa, _ra) = a.device_slice()?.device_ptr(&d.stream);
        let (pb, _rb) = b.device_slice()?.device_ptr(&d.stream);
        let (pc, _rc) = c.device_slice()?.device_ptr(&d.stream);
        let first = pb + 2 * shape.b_offset as u64;
        let second = pa + 2 * shape.a_offset as u64;
        // SAFETY: as for `gemm_f32`; alpha and beta are f32 as CUBLAS_COMPUTE_32F requires.
        unsafe {
            result::gemm_ex(
                *d.blas.handle(),
                s.op_first,
                s.op_second,
                s.m,
                s.n,
                s.k,
                (&alpha) as *const f32 as *const _,
                first as *const _,
                sys::cudaDataType_t::CUDA_R_16BF,
                s.ld_first,
                second as *const _,
                sys::cudaDataType_t::CUDA_R_16BF,
                s.ld_second,
                (&beta) as *const f32 as *const _,
                pc as *mut _,
                sys::cudaDataType_t::CUDA_R_16BF,
                s.ldc,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::Call(format!("cublasGemmEx (bf16): {e:?}")))
    }
}

/// A row-major product as cuBLAS's column-major call: `C^T = B^T A^T`, so B is the first
/// operand and A the second.
pub(super) struct ColumnMajor {
    op_first: cudarc::cublas::sys::cublasOperation_t,
    op_second: cudarc::cublas::sys::cublasOperation_t,
    m: i32,
    n: i32,
    k: i32,
    ld_first: i32,
    ld_second: i32,
    ldc: i32,
    batches: i32,
}

/// A dense copy of a view (see `CudaDevice::dense`).
struct Dense {
    buffer: CudaBuffer,
    shape: Vec<usize>,
    strides: Vec<usize>,
}

impl Dense {
    fn view(&self) -> CudaView<'_> {
        CudaView {
            buffer: &self.buffer,
            offset: 0,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        }
    }
}

/// How cuBLAS reads a `[rows, cols]` operand with these strides: `(transposed, leading
/// dimension)` (rows along memory, or columns along memory), or `None` when neither stride
/// is 1 (or rows overlap), so it must be copied first.
fn stored_as(
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
) -> Option<(bool, usize)> {
    if (cols == 1 || col_stride == 1) && (rows == 1 || row_stride >= cols) {
        return Some((false, if rows == 1 { cols } else { row_stride }));
    }
    if (rows == 1 || row_stride == 1) && (cols == 1 || col_stride >= rows) {
        return Some((true, if cols == 1 { rows } else { col_stride }));
    }
    None
}

/// Checks that every matrix of `shape` lies inside buffers of `a`, `b` and `c` values and
/// that cuBLAS's 32-bit sizes hold it, and gives the column-major call.
pub(super) fn check_gemm(shape: GemmShape, a: usize, b: usize, c: usize) -> Result<ColumnMajor> {
    use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
    let GemmShape { m, n, k, .. } = shape;
    // Stored [rows, cols] of A and B, and their leading dimensions (at least a row).
    let [(a_rows, a_cols, a_ld), (b_rows, b_cols, b_ld)] = shape.stored();
    let extent = |rows: usize, cols: usize, ld: usize| {
        if rows == 0 || cols == 0 {
            Some(0)
        } else {
            (rows - 1).checked_mul(ld)?.checked_add(cols)
        }
    };
    let fits = |len: usize, offset: usize, stride: usize, size: Option<usize>| {
        shape
            .batches
            .checked_sub(1)
            .and_then(|last| last.checked_mul(stride))
            .and_then(|first| first.checked_add(offset))
            .zip(size)
            .and_then(|(first, size)| first.checked_add(size))
            .is_some_and(|end| end <= len)
    };
    let int = |v: usize| i32::try_from(v).ok();
    let (Some(mi), Some(ni), Some(ki), Some(bi), Some(a_ldi), Some(b_ldi)) = (
        int(m),
        int(n),
        int(k),
        int(shape.batches),
        int(a_ld),
        int(b_ld),
    ) else {
        return Err(GpuError::Call(format!(
            "product {m}x{k}x{n} ({} batches) exceeds cuBLAS's 32-bit sizes",
            shape.batches
        )));
    };
    if shape.batches == 0
        || !fits(
            a,
            shape.a_offset,
            shape.stride_a,
            extent(a_rows, a_cols, a_ld),
        )
        || !fits(
            b,
            shape.b_offset,
            shape.stride_b,
            extent(b_rows, b_cols, b_ld),
        )
        || !fits(c, 0, shape.stride_c, m.checked_mul(n))
    {
        return Err(GpuError::Call(format!(
            "product {m}x{k}x{n} over {} batches does not fit buffers of {a}, {b} and {c} values",
            shape.batches
        )));
    }
    Ok(ColumnMajor {
        // B row-major [k, n] is column-major [n, k] (leading dimension its row stride);
        // stored as [n, k] it is column-major [k, n], transposed.
        op_first: if shape.b_transposed {
            CUBLAS_OP_T
        } else {
            CUBLAS_OP_N
        },
        ld_first: b_ldi,
        op_second: if shape.a_transposed {
            CUBLAS_OP_T
        } else {
            CUBLAS_OP_N
        },
        ld_second: a_ldi,
        m: ni,
        n: mi,
        k: ki,
        ldc: ni.max(1),
        batches: bi,
    })
}

#[cfg(test)]
mod tests {
    use super::{GemmShape, check_gemm, stored_as};

    #[test]
    fn a_row_major_product_becomes_the_transposed_column_major_call() {
        let s = check_gemm(GemmShape::plain(3, 5, 7), 21, 35, 15).unwrap();
        assert_eq!((s.m, s.n, s.k), (5, 3, 7));
        assert_eq!((s.ld_first, s.ld_second, s.ldc), (5, 7, 5));
        let t = GemmShape {
            a_transposed: true,
            b_transposed: true,
            ..GemmShape::plain(3, 5, 7)
        };
        let s = check_gemm(t, 21, 35, 15).unwrap();
        assert_eq!((s.ld_first, s.ld_second), (7, 3));
    }

    #[test]
    fn strided_operands_keep_their_row_stride_as_the_leading_dimension() {
        let t = GemmShape {
            a_row_stride: Some(10),
            b_transposed: true,
            b_row_stride: Some(9),
            a_offset: 2,
            ..GemmShape::plain(3, 5, 7)
        };
        // A's last row ends at 2 + 2 * 10 + 7 = 29; B's at 4 * 9 + 7 = 43.
        let s = check_gemm(t, 29, 43, 15).unwrap();
        assert_eq!((s.ld_first, s.ld_second), (9, 10));
        assert!(check_gemm(t, 28, 43, 15).is_err());
        assert!(check_gemm(t, 29, 42, 15).is_err());
    }

    #[test]
    fn views_with_a_unit_stride_are_read_in_place_and_others_are_not() {
        assert_eq!(stored_as(3, 7, 7, 1), Some((false, 7)));
        assert_eq!(stored_as(3, 7, 1, 3), Some((true, 3)));
        assert_eq!(stored_as(1, 7, 0, 1), Some((false, 7)));
        assert_eq!(stored_as(3, 7, 14, 2), None);
        assert_eq!(stored_as(3, 7, 0, 1), None);
    }

    #[test]
    fn a_product_past_its_buffers_is_refused() {
        assert!(check_gemm(GemmShape::plain(3, 5, 7), 20, 35, 15).is_err());
        let batched = GemmShape {
            batches: 2,
            ..GemmShape::plain(3, 5, 7)
        };
        assert!(check_gemm(batched, 42, 70, 29).is_err());
        assert!(check_gemm(batched, 42, 70, 30).is_ok());
        assert!(check_gemm(GemmShape::plain(1 << 31, 1, 1), usize::MAX, 1, usize::MAX).is_err());
    }
}
