//! The driver of compiler-generated pointwise kernels: walks `N` input layouts of one shape
//! together and writes `M` outputs, calling the generated body once per element.
//!
//! The body is a closure the `graph!` macro emits from a fusion group (a chain such as
//! `relu(x @ w + b) * mask`), so after inlining each group is one loop that reads every input
//! once and writes every output once. Splitting follows the rule of every kernel here: fixed
//! pieces, independent of the thread count.

use super::check::{self, KResult};
use super::stores::{Stores, store_block, stream_copy};
use super::strided::{CHUNK, Walk};

/// Elements from which a fused group splits across threads: half the elementwise kernels'
/// threshold, since a fused body does several ops' work per element (measured: the MLP
/// step's [256, 128] groups gain from splitting).
const FUSED_THRESHOLD: usize = CHUNK;
use crate::layout::Layout;

/// A base pointer shared by the pieces of one parallel loop; each piece writes a disjoint range.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: pieces write disjoint ranges of the buffer (see `map_fused`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// `body` applied to every element of `shape`: input `k` is read through `inputs[k]`, whose
/// layout must already have `shape` (broadcast axes have stride 0; refused otherwise).
/// Returns `M` contiguous buffers of `shape`.
pub fn map_fused<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    shape: &[usize],
    body: F,
) -> KResult<[Vec<f32>; M]>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    let n = check::elements("map_fused", shape)?;
    let mut outs: [Vec<f32>; M] = std::array::from_fn(|_| crate::pool::take(n));
    map_fused_into(
        inputs,
        shape,
        outs.each_mut().map(|o| &mut o[..]),
        None,
        body,
    )?;
    Ok(outs)
}

/// [`map_fused`] writing its first output over `donor`, the contiguous buffer of input
/// `donor_index` (which the caller no longer needs): each element of that input is read just
/// before the result overwrites it, so the group needs no fresh buffer for that output.
/// `inputs[donor_index]` is not read (pass an empty slice with any layout of `shape`).
pub fn map_fused_in_place<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    shape: &[usize],
    donor_index: usize,
    donor: Vec<f32>,
    body: F,
) -> KResult<[Vec<f32>; M]>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    let n = check::elements("map_fused_in_place", shape)?;
    let mut donor = Some(donor);
    let mut outs: [Vec<f32>; M] = std::array::from_fn(|m| match (m, donor.take()) {
        (0, Some(d)) => d,
        _ => crate::pool::take(n),
    });
    let slices = outs.each_mut().map(|o| &mut o[..]);
    map_fused_into(inputs, shape, slices, Some(donor_index), body)?;
    Ok(outs)
}

/// [`map_fused`] writing into `outs`, `M` buffers of `shape`'s element count the caller
/// provides (planned arena regions, recycled buffers). With `in_place = Some(k)`, `outs[0]`
/// holds input `k`'s values in row-major order on entry and each is read just before the
/// result overwrites it; `inputs[k]` is then not read (pass an empty slice with any layout of
/// `shape`).
pub fn map_fused_into<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    shape: &[usize],
    outs: [&mut [f32]; M],
    in_place: Option<usize>,
    body: F,
) -> KResult<()>
where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    const K: &str = "map_fused";
    if let Some(donor_index) = in_place {
        check::shapes(K, donor_index < N && M > 0, || {
            format!("input {donor_index} of {N} cannot give its buffer to output 0 of {M}")
        })?;
    }
    for (k, (data, l)) in inputs.iter().enumerate() {
        if Some(k) != in_place {
            check::view(K, check::input_name(k), data.len(), l)?;
            check::same_shape(K, check::input_name(k), l, shape)?;
        }
    }
    let n = check::elements(K, shape)?;
    for (m, out) in outs.iter().enumerate() {
        check::shapes(K, out.len() == n, || {
            format!("output {m} holds {} values, the shape {n}", out.len())
        })?;
    }
    let contiguous = Layout::contiguous(shape);
    let inputs: [(&[f32], &Layout); N] = std::array::from_fn(|k| {
        if Some(k) == in_place {
            (&[][..], &contiguous)
        } else {
            inputs[k]
        }
    });
    drive(inputs, shape, outs, in_place, &body);
    Ok(())
}

/// The loop behind both entry points. With `in_place = Some(k)`, input `k` is read from
/// output 0's own buffer, element by element before it is overwritten.
fn drive<const N: usize, const M: usize, F>(
    inputs: [(&[f32], &Layout); N],
    shape: &[usize],
    mut outs: [&mut [f32]; M],
    in_place: Option<usize>,
    body: &F,
) where
    F: Fn([f32; N]) -> [f32; M] + Sync + Copy,
{
    let n = outs.first().map_or(0, |o| o.len());
    let ptrs: [OutPtr; M] = std::array::from_fn(|m| OutPtr(outs[m].as_mut_ptr()));
    let walk: Walk<N> = Walk::new(shape, std::array::from_fn(|k| inputs[k].1));
    let data: [&[f32]; N] = std::array::from_fn(|k| inputs[k].0);
    let stores = Stores::for_sizes(n, N, M);
    // Rows shorter than this with an input that does not step through memory one value at a
    // time (a row statistic broadcast over `[B, 10]`) would make one run per row, each paying
    // the SIMD dispatch and loop set-up for a few values; such inputs are gathered for the
    // whole piece instead, and the piece runs as one contiguous run.
    let inner = shape.last().copied().unwrap_or(1);
    let flat: [bool; N] =
        std::array::from_fn(|k| Some(k) == in_place || inputs[k].1.is_contiguous());
    let gather_short_rows = inner < SHORT_ROW && flat.iter().any(|f| !f);
    let piece = |start: usize, len: usize| {
        // SAFETY: `start..start + len` lies inside every output buffer (each has `n` elements)
        // and no other piece touches it.
        let mut dst: [&mut [f32]; M] = std::array::from_fn(|m| unsafe {
            std::slice::from_raw_parts_mut(ptrs[m].0.add(start), len)
        });
        if gather_short_rows {
            let mut staged: [Option<crate::pool::Scratch>; N] = std::array::from_fn(|k| {
                (!flat[k]).then(|| crate::pool::Scratch(crate::pool::take(len)))
            });
            walk.runs(start, len, |at, run, pos, strides| {
                for (k, stage) in staged.iter_mut().enumerate() {
                    let Some(stage) = stage else { continue };
                    gather(&mut stage.0[at..at + run], data[k], pos[k], strides[k]);
                }
            });
            let offsets: [usize; N] = std::array::from_fn(|k| inputs[k].1.offset);
            let src: [&[f32]; N] = std::array::from_fn(|k| match &staged[k] {
                Some(stage) => &stage.0[..],
                None if Some(k) == in_place => &[][..],
                None => &data[k][offsets[k] + start..offsets[k] + start + len],
            });
            contiguous_run(&src, &mut dst, 0, len, stores, in_place, body);
            return;
        }
        let each_run = |at: usize, run: usize, pos: [usize; N], strides: [usize; N]| {
            if strides.iter().all(|&s| s == 1) {
                let src: [&[f32]; N] = std::array::from_fn(|k| {
                    if Some(k) == in_place {
                        &[][..]
                    } else {
                        &data[k][pos[k]..pos[k] + run]
                    }
                });
                contiguous_run(&src, &mut dst, at, run, stores, in_place, body);
            } else if strides.iter().all(|&s| s <= 1) {
                // Inputs broadcast along the run (a row statistic, a mask repeated over the
                // batch) are copied into short stack runs of one value, so the run still
                // goes through the vectorized loop instead of the strided one.
                let mut splat = [[0.0f32; SPLAT]; N];
                let mut done = 0;
                while done < run {
                    let len = SPLAT.min(run - done);
                    for k in 0..N {
                        if strides[k] == 0 && Some(k) != in_place {
                            splat[k][..len].fill(data[k][pos[k]]);
                        }
                    }
                    let src: [&[f32]; N] = std::array::from_fn(|k| {
                        if Some(k) == in_place {
                            &[][..]
                        } else if strides[k] == 0 {
                            &splat[k][..len]
                        } else {
                            &data[k][pos[k] + done..pos[k] + done + len]
                        }
                    });
                    contiguous_run(&src, &mut dst, at + done, len, stores, in_place, body);
                    done += len;
                }
            } else {
                for i in 0..run {
                    let r = body(std::array::from_fn(|k| {
                        if Some(k) == in_place {
                            dst[0][at + i]
                        } else {
                            data[k][pos[k] + i * strides[k]]
                        }
                    }));
                    for m in 0..M {
                        dst[m][at + i] = r[m];
                    }
                }
            }
        };
        walk.runs(start, len, each_run);
    };
    if n <= FUSED_THRESHOLD {
        piece(0, n);
    } else {
        super::strided::for_each_task(n.div_ceil(CHUNK), &|c| {
            piece(c * CHUNK, CHUNK.min(n - c * CHUNK));
            // Non-temporal stores are weakly ordered: make them visible before the piece
            // counts as done.
            #[cfg(target_arch = "x86_64")]
            if stores != Stores::Cached {
                // SAFETY: a store fence has no preconditions; SSE is part of x86-64.
                unsafe { std::arch::x86_64::_mm_sfence() };
            }
        });
    }
}

/// Length of the stack runs that hold a broadcast input's value (see `drive`).
const SPLAT: usize = 64;

/// `dst[j] = data[at + j * stride]`: a value repeated (stride 0), a copy (1), or a strided
/// gather, each as its own loop.
#[inline(always)]
pub(crate) fn gather(dst: &mut [f32], data: &[f32], at: usize, stride: usize) {
    match stride {
        0 => dst.fill(data[at]),
        1 => dst.copy_from_slice(&data[at..at + dst.len()]),
        _ => {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = data[at + j * stride];
            }
        }
    }
}

/// Rows shorter than this are not walked run by run when an input needs gathering (see
/// `drive`).
const SHORT_ROW: usize = 64;

/// Lanes computed together: the body runs on `LANES` elements in a row so the compiler can
/// keep them in one vector register.
pub(super) const LANES: usize = 8;

/// `body` over `run` elements whose inputs are the contiguous slices `src`, written to
/// `dst[m][at..at + run]`; input `in_place` (if any) is read from `dst[0]` instead.
#[inline(always)]
fn contiguous_run<const N: usize, const M: usize, F>(
    src: &[&[f32]; N],
    dst: &mut [&mut [f32]; M],
    at: usize,
    run: usize,
    stores: Stores,
    in_place: Option<usize>,
    body: &F,
) where
    F: Fn([f32; N]) -> [f32; M] + Copy,
{
    if plain_run(src, dst, at, run, stores, in_place, body) {
        return;
    }
    let full = run - run % LANES;
    let mut i = 0;
    while i < full {
        let mut block = [[0.0f32; LANES]; M];
        let mut own = [0.0f32; LANES];
        if in_place.is_some() {
            own.copy_from_slice(&dst[0][at + i..at + i + LANES]);
        }
        // One bounds check per input and block, none per element, so the lanes vectorize.
        let lanes: [&[f32; LANES]; N] = std::array::from_fn(|k| {
            if Some(k) == in_place {
                return &own;
            }
            let slice = &src[k][i..i + LANES];
            <&[f32; LANES]>::try_from(slice).unwrap_or(&[0.0; LANES])
        });
        for lane in 0..LANES {
            let r = body(std::array::from_fn(|k| lanes[k][lane]));
            for m in 0..M {
                block[m][lane] = r[m];
            }
        }
        for m in 0..M {
            store_block(
                &mut dst[m][at + i..at + i + LANES],
                &block[m],
                stores != Stores::Cached,
            );
        }
        i += LANES;
    }
    for i in full..run {
        let r = body(std::array::from_fn(|k| {
            if Some(k) == in_place {
                dst[0][at + i]
            } else {
                src[k][i]
            }
        }));
        for m in 0..M {
            dst[m][at + i] = r[m];
        }
    }
}

/// [`contiguous_run`] as one plain loop over pointers: LLVM's loop vectorizer widens it
/// reliably, where the 8-lane blocks were left scalar in some instantiations (a GELU gradient
/// ran at 3 ns per element instead of 0.7). Pointers, not slices, because the donated input
/// is read from output 0 at the index being written, which slices cannot express without
/// per-element branches that keep the loop scalar. False (nothing written) when a slice is
/// shorter than the run, which the callers never pass; the checked block loop then runs.
#[inline(always)]
fn plain_run<const N: usize, const M: usize, F>(
    src: &[&[f32]; N],
    dst: &mut [&mut [f32]; M],
    at: usize,
    run: usize,
    stores: Stores,
    in_place: Option<usize>,
    body: &F,
) -> bool
where
    F: Fn([f32; N]) -> [f32; M] + Copy,
{
    let inputs_fit = src
        .iter()
        .enumerate()
        .all(|(k, s)| Some(k) == in_place || s.len() >= run);
    if !inputs_fit || dst.iter().any(|d| d.len() < at + run) {
        return false;
    }
    let outs: [*mut f32; M] = std::array::from_fn(|m| dst[m][at..].as_mut_ptr());
    let ins: [*const f32; N] = std::array::from_fn(|k| {
        if Some(k) == in_place {
            outs[0] as *const f32
        } else {
            src[k].as_ptr()
        }
    });
    // Compiled for the widest vectors this CPU has (`simd::widest`). Locals, not the
    // caller's arrays or body: `widest` runs this in a separate function, where the caller's
    // stack is memory the stores might alias, which kept the pointers (and values the body
    // captured, such as the call's rounding) reloaded every element and the loop scalar.
    let body: F = *body;
    match in_place {
        None if stores != Stores::Cached => super::simd::widest(
            #[inline(always)]
            move || {
                let (ins, outs, run, body) = (ins, outs, run, body);
                // Results go to a block on the stack first (2 KiB per output, well inside
                // L1), where the body's loop vectorizes without a store per lane, and then
                // to the output as `stores` says (see `Stores`).
                let mut staged = [[0.0f32; STAGE]; M];
                let mut start = 0;
                while start < run {
                    let len = STAGE.min(run - start);
                    // SAFETY: every input holds `run` values from its pointer and every output
                    // `at + run` from `outs` (checked above); the stack blocks hold STAGE >=
                    // len values and overlap nothing.
                    unsafe {
                        let block_ins: [*const f32; N] = std::array::from_fn(|k| ins[k].add(start));
                        let block_outs: [*mut f32; M] =
                            std::array::from_fn(|m| staged[m].as_mut_ptr());
                        pointer_loop(block_ins, block_outs, len, &body);
                        for m in 0..M {
                            if stores == Stores::NonTemporal {
                                stream_copy(staged[m].as_ptr(), outs[m].add(start), len);
                            } else {
                                std::ptr::copy_nonoverlapping(
                                    staged[m].as_ptr(),
                                    outs[m].add(start),
                                    len,
                                );
                            }
                        }
                    }
                    start += len;
                }
            },
        ),
        None => super::simd::widest(
            #[inline(always)]
            move || {
                let (ins, outs, run, body) = (ins, outs, run, body);
                // SAFETY: every input holds at least `run` values and every output at least
                // `at + run` (checked above).
                unsafe { pointer_loop(ins, outs, run, &body) }
            },
        ),
        Some(donor) => super::simd::widest(
            #[inline(always)]
            move || {
                let (ins, outs, run, body) = (ins, outs, run, body);
                // The donated input is read from a copy of each block of output 0 on the
                // stack: reading and writing one buffer made the loop's overlap check fail,
                // so it ran scalar; the copy never overlaps anything.
                let mut own = [0.0f32; IN_PLACE_BLOCK];
                let mut start = 0;
                while start < run {
                    let len = IN_PLACE_BLOCK.min(run - start);
                    // SAFETY: output 0 holds `at + run` values from `outs[0]` (checked above)
                    // and `own` holds IN_PLACE_BLOCK >= len; the ranges are disjoint. The
                    // block offsets stay inside every buffer, and the loop reads and writes
                    // `len` values from them.
                    unsafe {
                        std::ptr::copy_nonoverlapping(outs[0].add(start), own.as_mut_ptr(), len);
                        let block_ins: [*const f32; N] = std::array::from_fn(|k| {
                            if k == donor {
                                own.as_ptr()
                            } else {
                                ins[k].add(start)
                            }
                        });
                        let block_outs: [*mut f32; M] = std::array::from_fn(|m| outs[m].add(start));
                        pointer_loop(block_ins, block_outs, len, &body);
                    }
                    start += len;
                }
            },
        ),
    }
    true
}

/// Values per output staged on the stack in [`plain_run`] when streaming.
const STAGE: usize = 512;

/// Values of a donated input copied per block in [`plain_run`] (1 KiB of stack).
const IN_PLACE_BLOCK: usize = 256;

/// `outs[m][i] = body(ins[..][i])[m]` for `i < len`: a loop LLVM's vectorizer widens.
///
/// # Safety
/// Each input pointer is valid for `len` reads and each output for `len` writes; an output
/// range overlaps no input range.
#[inline(always)]
pub(crate) unsafe fn pointer_loop<const N: usize, const M: usize, F>(
    ins: [*const f32; N],
    outs: [*mut f32; M],
    len: usize,
    body: &F,
) where
    F: Fn([f32; N]) -> [f32; M] + Copy,
{
    for i in 0..len {
        // SAFETY: `i < len` (the caller's contract).
        unsafe {
            let r = body(std::array::from_fn(|k| *ins[k].add(i)));
            for m in 0..M {
                *outs[m].add(i) = r[m];
            }
        }
    }
}
