//! models: models written in the rtx DSL, and the training loop the CLI runs.
//!
//! In the map of DESIGN.md this crate is a user of `rtx-core`: it shows what a model file
//! looks like (`mlp.rs`, `cnn.rs`) and trains them on the 8x8 digits data set that ships in
//! `data/` (`data.rs`); `gpt.rs` is a character-level transformer trained on the embedded
//! Shakespeare corpus (`corpus.rs`) by `train_gpt.rs`, which `plot.rs` draws the loss curve of. `bench.rs` (with `bench_models.rs`) is the `models bench` program.

pub mod bench;
pub mod bench_models;
pub mod cnn;
pub mod corpus;
pub mod data;
pub mod generate;
pub mod gpt;
pub mod mlp;
pub mod plot;
pub mod train;
pub mod train_gpt;
