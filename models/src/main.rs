//! `models`: train the DSL models on the embedded 8x8 digits.
//!
//! `cargo run --release` trains the default model (the MLP); `models train --model cnn
//! --epochs 20 --seed 7 --save cnn.safetensors` picks the rest.

use clap::{Parser, Subcommand, ValueEnum};
use models::cnn::Cnn;
use models::mlp::Mlp;
use models::train::{Classifier, TrainConfig, TrainReport, train};
use rtx_core::prelude::*;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "models",
    about = "Train RustyTorch++ models on the embedded 8x8 digits data set"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model and report its held-out accuracy.
    Train {
        #[arg(long, value_enum, default_value_t = Which::Mlp)]
        model: Which,
        /// Training epochs (default: the model's own).
        #[arg(long)]
        epochs: Option<usize>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Write the trained weights to this safetensors file.
        #[arg(long)]
        save: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Which {
    Mlp,
    Cnn,
}

fn run<M: Classifier>(cfg: &TrainConfig, save: Option<PathBuf>) -> Result<TrainReport> {
    println!("training {} on the 8x8 digits (seed {})", M::NAME, cfg.seed);
    let (model, report) = train::<M>(cfg)?;
    println!("parameters: {}", model.num_params());
    if let Some(path) = save {
        model.save_safetensors(&path)?;
        println!("saved weights to {}", path.display());
    }
    Ok(report)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (which, epochs, seed, save) = match cli.command {
        Some(Command::Train {
            model,
            epochs,
            seed,
            save,
        }) => (model, epochs, seed, save),
        None => (Which::Mlp, None, 0, None),
    };
    let cfg = TrainConfig {
        epochs,
        seed,
        progress: true,
        verbose: true,
    };
    let result = match which {
        Which::Mlp => run::<Mlp>(&cfg, save),
        Which::Cnn => run::<Cnn>(&cfg, save),
    };
    match result {
        Ok(r) => {
            println!(
                "final: model={} test_accuracy={:.4} epochs={} seconds={:.1}",
                r.model, r.test_accuracy, r.epochs, r.seconds
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
