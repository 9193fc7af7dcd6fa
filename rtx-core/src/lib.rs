//! rtx-core: the runtime of RustyTorch++ and the one crate a user imports.
//!
//! In the map of DESIGN.md this crate sits above `rtx-ir` (op definitions, shape rules),
//! `rtx-backends` (kernels) and `rtx-macros` (`#[model]`, `graph!`), and re-exports all three:
//! `use rtx_core::prelude::*` is the whole import. It holds `Tensor`, the single op dispatch
//! (`ops::run_op`) that compiled models and the IR executor share, layers and their
//! initialization, optimizers, checkpoints (safetensors; `resume.rs` for training state) and
//! `RtxError`. With the `wgpu` or `cuda` feature, tensors and models move to a GPU (`device.rs`) and
//! compiled graph functions run their fusion plan there (`gpu/`).

extern crate self as rtx_core;

pub mod amp;
pub mod batches;
pub mod bind;
pub mod checkpoint;
pub mod ctx;
pub mod device;
mod eager;
pub mod error;
pub mod exec;
pub mod fused;
pub mod gpu;
mod half;
pub mod layers;
pub mod module;
pub mod ops;
pub mod optim;
pub mod parallel;
pub mod planned;
pub mod profile;
pub mod resume;
pub mod rng;
pub mod schedule;
pub mod slots;
pub mod tensor;
pub mod train;

pub use amp::LossScaler;
pub use ctx::Ctx;
pub use device::Device;
pub use error::{Result, RtxError};
pub use layers::{Conv2d, Embedding, LayerNorm, Linear, Param1, Param2, Param3, Param4};
pub use module::{Grads, Module, join_name, with_name};
pub use rng::Rng;
pub use rtx_ir::Precision;
pub use tensor::{DType, Tensor};
pub use train::Model;

/// The graph IR (`Mlp::graph()` returns an `ir::ModelIr`).
pub use rtx_ir as ir;
/// Type-level dimensions used by generated generic-dimension checks.
pub use rtx_shapes as shapes;

#[doc(hidden)]
pub use rtx_macros::__model_impl;
pub use rtx_macros::{graph, model};

pub mod prelude {
    //! Everything a model file needs.
    pub use crate::checkpoint::Checkpoint;
    pub use crate::optim::{Adam, AdamW, Optimizer, Sgd};
    pub use crate::train::Model;
    pub use crate::{
        Conv2d, Ctx, DType, Device, Embedding, Grads, LayerNorm, Linear, LossScaler, Module,
        Param1, Param2, Param3, Param4, Precision,
    };
    pub use crate::{Result, Rng, RtxError, Tensor};
    pub use crate::{graph, model};
}
