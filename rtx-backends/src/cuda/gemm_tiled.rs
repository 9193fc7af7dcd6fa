//! A GEMM of our own in CUDA C: shared-memory tiles, for devices without cuBLAS. It is the
//! product the HIP backend runs (the same text builds under `HIP_PRELUDE`; ROCm's hipBLAS is
//! not a library Debian ships next to hiprtc), and on CUDA it is a second implementation of
//! [`CudaDevice::gemm_f32`]'s contract, checked against it on a GPU and against the CPU's
//! GEMM on the CPU stand-in (whose shim runs a block's threads side by side for it).
//!
//! Each block of 256 threads computes a 64 x 64 tile of C: per 16-wide slice of K it stages
//! A's 64 x 16 and B's 16 x 64 values in shared memory (read along whichever axis the
//! operand is stored along, so a warp's loads are contiguous), and each thread adds its
//! 4 x 4 outputs, spaced 16 apart so a warp reads 16 consecutive values of B. Each output is
//! one `fmaf` chain in K order.

use super::gemm::{GemmShape, check_gemm};
use super::runtime::{Arg, CudaBuffer, CudaDevice, CudaKernel};
use super::{GpuError, Result};

/// Rows and columns of C per block (the kernel's `RTX_TILE`).
const TILE: usize = 64;
/// Threads per block (the kernel's 16 x 16).
const THREADS: u32 = 256;

/// The kernel: meta words `m, n, k, flags (1: A stored [k, m], 2: B stored [n, k]), lda,
/// ldb, a_offset, b_offset, stride_a, stride_b, stride_c, tiles_m, tiles_n, batches`;
/// parameters A, B, C (dense `[m, n]` per batch).
pub const GEMM_TILED: CudaKernel<'static> = CudaKernel {
    name: "gemm_f32_tiled",
    entry: "rtx_gemm_f32_tiled",
    source: r#"
#define RTX_TILE 64
#define RTX_TILE_K 16
extern "C" __global__ void rtx_gemm_f32_tiled(RTX_META, const float* a, const float* b,
                                              float* c) {
    const unsigned int* p = RTX_META_WORDS;
    const unsigned int m = p[0], n = p[1], k = p[2], flags = p[3];
    const size_t lda = p[4], ldb = p[5];
    const unsigned int tiles_m = p[11], tiles_n = p[12], batches = p[13];
    const unsigned int block = blockIdx.y * gridDim.x + blockIdx.x;
    const unsigned int batch = block / (tiles_m * tiles_n);
    // Blocks past the last tile leave before any barrier, all their threads together.
    if (batch >= batches) return;
    const unsigned int tile = block % (tiles_m * tiles_n);
    const unsigned int row0 = tile / tiles_n * RTX_TILE, col0 = tile % tiles_n * RTX_TILE;
    const float* A = a + p[6] + (size_t)batch * p[8];
    const float* B = b + p[7] + (size_t)batch * p[9];
    float* C = c + (size_t)batch * p[10];
    const bool a_t = (flags & 1u) != 0, b_t = (flags & 2u) != 0;
    __shared__ float as[RTX_TILE_K][RTX_TILE];
    __shared__ float bs[RTX_TILE_K][RTX_TILE];
    const unsigned int t = threadIdx.x, tx = t % 16, ty = t / 16;
    float acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (unsigned int k0 = 0; k0 < k; k0 += RTX_TILE_K) {
        for (unsigned int q = 0; q < 4; ++q) {
            const unsigned int e = t + 256u * q;
            // Consecutive threads take consecutive addresses of the operand as stored.
            const unsigned int ar = a_t ? e % RTX_TILE : e / RTX_TILE_K;
            const unsigned int ak = a_t ? e / RTX_TILE : e % RTX_TILE_K;
            const unsigned int row = row0 + ar, kk = k0 + ak;
            as[ak][ar] = (row < m && kk < k)
                ? (a_t ? A[(size_t)kk * lda + row] : A[(size_t)row * lda + kk]) : 0.0f;
            const unsigned int bc = b_t ? e / RTX_TILE_K : e % RTX_TILE;
            const unsigned int bk = b_t ? e % RTX_TILE_K : e / RTX_TILE;
            const unsigned int col = col0 + bc, kb = k0 + bk;
            bs[bk][bc] = (col < n && kb < k)
                ? (b_t ? B[(size_t)col * ldb + kb] : B[(size_t)kb * ldb + col]) : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < RTX_TILE_K; ++kk) {
            float av[4], bv[4];
            for (int i = 0; i < 4; ++i) av[i] = as[kk][ty + 16 * i];
            for (int j = 0; j < 4; ++j) bv[j] = bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const unsigned int row = row0 + ty + 16 * i;
        for (int j = 0; j < 4; ++j) {
            const unsigned int col = col0 + tx + 16 * j;
            if (row < m && col < n) C[(size_t)row * n + col] = acc[i][j];
        }
    }
}
"#,
};

impl CudaDevice {
    /// `c = a @ b` in f32 by [`GEMM_TILED`], the contract of [`CudaDevice::gemm_f32`]
    /// (transposed, strided, offset and batched operands; C dense), for every size whose
    /// element offsets fit 32-bit meta words.
    pub fn gemm_f32_tiled(
        &self,
        shape: GemmShape,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &CudaBuffer,
    ) -> Result<()> {
        check_gemm(shape, a.len(), b.len(), c.len())?;
        let meta = tiled_meta(shape)?;
        let tiles = shape.m.div_ceil(TILE) * shape.n.div_ceil(TILE) * shape.batches;
        let args = [Arg::In(a), Arg::In(b), Arg::Out(c)];
        let threads = tiles.saturating_mul(THREADS as usize);
        self.run_kernel(&GEMM_TILED, &meta, &args, threads, THREADS)
    }
}

/// The kernel's meta words for `shape`, or an error naming the first value past 32 bits.
fn tiled_meta(shape: GemmShape) -> Result<[u32; 14]> {
    let [(_, _, lda), (_, _, ldb)] = shape.stored();
    let flags = usize::from(shape.a_transposed) | (usize::from(shape.b_transposed) << 1);
    let (tiles_m, tiles_n) = (shape.m.div_ceil(TILE), shape.n.div_ceil(TILE));
    let values = [
        ("m", shape.m),
        ("n", shape.n),
        ("k", shape.k),
        ("flags", flags),
        ("A's row stride", lda),
        ("B's row stride", ldb),
        ("A's offset", shape.a_offset),
        ("B's offset", shape.b_offset),
        ("A's batch stride", shape.stride_a),
        ("B's batch stride", shape.stride_b),
        ("C's batch stride", shape.stride_c),
        ("row tiles", tiles_m),
        ("column tiles", tiles_n),
        ("batches", shape.batches),
    ];
    let mut meta = [0u32; 14];
    for (word, (what, value)) in meta.iter_mut().zip(values) {
        *word = u32::try_from(value).map_err(|_| {
            GpuError::Call(format!(
                "gemm_f32_tiled: {what} is {value}, past the kernel's 32-bit meta words"
            ))
        })?;
    }
    // The kernel numbers blocks in 32 bits too.
    let blocks = tiles_m
        .checked_mul(tiles_n)
        .and_then(|t| t.checked_mul(shape.batches));
    if blocks.is_none_or(|b| u32::try_from(b).is_err()) {
        return Err(GpuError::Call(format!(
            "gemm_f32_tiled: {tiles_m} x {tiles_n} tiles in {} batches need more than 2^32 blocks",
            shape.batches
        )));
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::{GemmShape, tiled_meta};

    #[test]
    fn meta_words_carry_the_stored_layouts_and_the_tile_counts() {
        let shape = GemmShape {
            a_transposed: true,
            b_transposed: true,
            b_row_stride: Some(9),
            a_offset: 4,
            ..GemmShape::plain(70, 130, 7)
        };
        let meta = tiled_meta(shape).unwrap();
        // A stored [7, 70]: its rows are 70 apart; B stored [130, 7] in rows 9 apart.
        assert_eq!(meta[..6], [70, 130, 7, 3, 70, 9]);
        assert_eq!(meta[6], 4);
        assert_eq!(meta[11..], [2, 3, 1]);
    }

    #[test]
    fn an_offset_past_32_bits_is_refused_with_its_name() {
        let shape = GemmShape {
            b_offset: 1 << 33,
            ..GemmShape::plain(2, 2, 2)
        };
        let error = tiled_meta(shape).unwrap_err().to_string();
        assert!(error.contains("B's offset"), "{error}");
    }
}
