//! rtx-serve: the inference server (not built yet).
//!
//! In the map of DESIGN.md this crate sits on top of `rtx-core` and `rtx-backends`. It will hold
//! an HTTP server with OpenAI-compatible completions and chat endpoints, SSE streaming,
//! continuous batching, a paged KV cache, sampling, metrics and backpressure. Nothing is
//! implemented yet; this crate deliberately exports nothing.
