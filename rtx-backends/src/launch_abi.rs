//! How CUDA and HIP kernels receive their meta words: the C text every kernel source of
//! those backends is compiled behind, shared by NVRTC, hiprtc and the CPU stand-in.

/// The launch ABI every kernel of this backend is written to, put in front of each source by
/// every compiler here (`cuda::compile`, `hip::compile`, `cuda::on_cpu`). A kernel's first parameter
/// is `RTX_META`: its meta words *by value*, up to [`META_INLINE_WORDS`] of them in the
/// launch's own parameter space, so a launch queues one driver call instead of an
/// allocation, a copy from pageable memory and a free; longer meta words are uploaded and
/// passed as `spill`. `__grid_constant__` lets the kernel index the words where the launch
/// put them (without it every thread would first copy the struct); hiprtc 5.2 and the CPU
/// shim lack it and make a plain by-value parameter of it. The body reads them through
/// `RTX_META_WORDS` (a `const unsigned int*`). `cuda/runtime.rs`'s `LaunchMeta` is the same
/// struct on the Rust side.
pub const LAUNCH_ABI: &str = r#"
#ifndef __grid_constant__
#define __grid_constant__
#endif
struct rtx_meta { const unsigned int* spill; unsigned int words[126]; };
#define RTX_META const __grid_constant__ rtx_meta rtx_meta_arg
#define RTX_META_WORDS (rtx_meta_arg.spill ? rtx_meta_arg.spill : rtx_meta_arg.words)
"#;

/// How many meta words a launch passes in its parameters (`rtx_meta::words` of
/// [`LAUNCH_ABI`]); a kernel given more reads them from a buffer.
pub const META_INLINE_WORDS: usize = 126;

/// `rtx_meta` of [`LAUNCH_ABI`] on the Rust side: what a launch passes as a kernel's first
/// parameter (512 bytes, the C struct's size and alignment).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchMeta {
    /// Where the words are when they do not fit in `words` (a device pointer; a host one on
    /// the CPU stand-in), else 0.
    pub spill: u64,
    pub words: [u32; META_INLINE_WORDS],
}

const _: () = assert!(std::mem::size_of::<LaunchMeta>() == 512);

impl LaunchMeta {
    /// `meta` in the parameter itself, when it fits.
    pub fn inline(meta: &[u32]) -> Option<LaunchMeta> {
        let mut words = [0; META_INLINE_WORDS];
        words.get_mut(..meta.len())?.copy_from_slice(meta);
        Some(LaunchMeta { spill: 0, words })
    }

    /// Meta words read from `spill`, a buffer holding all of them.
    pub fn spilled(spill: u64) -> LaunchMeta {
        LaunchMeta {
            spill,
            words: [0; META_INLINE_WORDS],
        }
    }
}
