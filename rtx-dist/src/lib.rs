//! rtx-dist: data-parallel training over many processes (not built yet).
//!
//! In the map of DESIGN.md this crate sits on top of `rtx-core` and `rtx-backends`. It will hold
//! data parallelism over MPI (CPU) and NCCL (CUDA): a bucketed all-reduce of gradients overlapped
//! with the compiled backward pass, optimizer state sharded across ranks, and checkpoint/resume.
//! Nothing is implemented yet; this crate deliberately exports nothing, so no caller can mistake
//! it for a working layer.
